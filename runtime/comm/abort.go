package comm

import (
	"errors"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
)

// aborter is what Abort needs from a device beyond release; cudaDevice
// implements it, and fakes in tests. Every method is safe while another
// goroutine is inside launch, runNCCL or synchronize.
type aborter interface {
	// releaseKernels frees generated kernels waiting for a peer without
	// touching them: on a stream of its own it raises the abort word,
	// which every wait of the kernels polls beside its deadline (barrier
	// waits and LL/LL128 line waits); a kernel that finds it raised
	// returns at once, without signalling any later barrier, so its live
	// peers time out rather than read data it never computed. From then
	// on synchronize returns promptly instead of waiting for the stream.
	releaseKernels(abortWord cuda.DevicePtr) error
	// abortNCCL aborts the NCCL communicator (ncclCommAbort), which stops
	// NCCL kernels still running; nil without NCCL.
	abortNCCL() error
	// drained waits up to timeout for this rank's streams to finish after
	// releaseKernels, reporting whether they did.
	drained(timeout time.Duration) bool
}

// Abort stops the communicator now, from any goroutine, without waiting
// for peers: a collective or Synchronize blocked on another goroutine
// returns ErrAborted promptly, generated kernels waiting for a peer are
// released (see aborter), NCCL registrations are deregistered and the NCCL
// communicator aborted, and the device's resources are freed once its
// kernels have ended (within Config.Timeout; otherwise they are left, and
// the error says so). Later calls fail at once with ErrAborted. Peers are
// not told: they reach their own timeouts, or abort too. A new
// communicator (on a fresh store or group name) works afterwards. Abort is
// idempotent; after Close it only marks the communicator aborted.
//
// On the host backend, Abort closes the group; a host call in flight ends
// at its own deadline (Config.Timeout) or its Options.Context.
func (c *Communicator) Abort() error {
	if !c.aborted.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	if c.gpu != nil {
		errs = append(errs, c.gpu.releaseKernels())
		// Before the NCCL communicator goes: deregistration needs it.
		errs = append(errs, c.reg.closeAll(true), c.gpu.abortNCCL())
	}
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		// The call in flight returns promptly now; wait for it, and for
		// Synchronize, before freeing what they use.
		c.busy.Lock()
		defer c.busy.Unlock()
		c.waiting.Lock()
		defer c.waiting.Unlock()
		var err error
		if c.gpu != nil {
			err = c.gpu.teardown()
		} else {
			err = c.b.close()
		}
		c.closeErr = errors.Join(classify(err), c.leave())
		errs = append(errs, c.closeErr)
	})
	return classify(errors.Join(errs...))
}

// abortedError is the error of a call on, or interrupted by, Abort.
func (c *Communicator) abortedError(op string) error {
	return errorf(ErrAborted, "comm: rank %d: %s: the communicator was aborted (Communicator.Abort); make a new one", c.cfg.Rank, op)
}

// abortWord is the LL abort word: args.seq[CG_MAX_BLOCKS + 2].
func (g *gpuComm) abortWord() cuda.DevicePtr {
	return g.seq + cuda.DevicePtr((g.lib.MaxBlocks+2)*8)
}

// releaseKernels marks the backend broken by Abort and releases kernels
// waiting for peers (aborter.releaseKernels).
func (g *gpuComm) releaseKernels() error {
	g.setBroken(errorf(ErrAborted, "comm: rank %d: the communicator was aborted (Communicator.Abort); make a new one", g.cfg.Rank))
	a, ok := g.dev.(aborter)
	if !ok || len(g.signal) == 0 {
		return nil
	}
	return a.releaseKernels(g.abortWord())
}

// abortNCCL aborts the device's NCCL communicator, if any.
func (g *gpuComm) abortNCCL() error {
	if a, ok := g.dev.(aborter); ok {
		return a.abortNCCL()
	}
	return nil
}

// teardown frees the device's resources after Abort, without Close's
// store barrier, once its kernels have ended.
func (g *gpuComm) teardown() error {
	if a, ok := g.dev.(aborter); ok && !a.drained(g.cfg.Timeout) {
		return errorf(ErrTimeout, "comm: rank %d: a kernel still runs %v after Abort; the communicator's device memory is left allocated (freeing it would wait for the kernel)", g.cfg.Rank, g.cfg.Timeout)
	}
	return g.dev.release()
}

// attachRegistry sets up NCCL registration once NCCL is open on a device
// that can register: registers the allocator's segments and subscribes to
// its hooks.
func (c *Communicator) attachRegistry() error {
	r, ok := c.gpu.dev.(registrar)
	if !c.gpu.ncclOK || !ok {
		return nil
	}
	c.reg = newRegistry(r, c.cfg.Rank)
	if c.cfg.Allocator != nil {
		c.reg.attach(c.cfg.Allocator)
		// A segment the hook could not register makes New fail: the
		// caller asked for registration and would silently not get it.
		c.reg.mu.Lock()
		err := errors.Join(c.reg.hookEr...)
		c.reg.hookEr = nil
		c.reg.mu.Unlock()
		if err != nil {
			return errors.Join(classify(err), c.reg.closeAll(false))
		}
	}
	return nil
}
