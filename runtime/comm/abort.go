package comm

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
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
	// releaseKeepingRegion frees what release frees except the staging
	// region (stage, scratch, signal pad: what peers' kernels read and
	// signal into) and what it needs (the CUDA context), and returns a
	// function that frees those; nil when there is no region.
	releaseKeepingRegion() (freeRegion func() error, err error)
}

// Abort stops the communicator now, from any goroutine, without waiting
// for peers: a collective or Synchronize blocked on another goroutine
// returns ErrAborted promptly, generated kernels waiting for a peer are
// released (see aborter), NCCL registrations are deregistered and the NCCL
// communicator aborted, and the device's resources are freed once its
// kernels have ended (within Config.Timeout; otherwise they are left, and
// the error says so), except the staging region peers' kernels signal
// into and read, which stays until every rank has left the group or
// parkFactor x Config.Timeout have passed (freeWhenLeft). Later calls fail
// at once with ErrAborted. Peers are not told to stop: they reach their
// own timeouts (never a fault), or abort too; a peer whose kernel timed
// out waiting for this rank reads that it aborted (TimeoutError.Calls). A new
// communicator (on a fresh store or group name) works afterwards. Abort is
// idempotent; after Close it only marks the communicator aborted.
//
// Across hosts, Abort aborts the host's communicator as above and both NCCL
// communicators (a wait for them returns at once), and frees the device
// once its streams have drained (within Config.Timeout, else it is left).
//
// On the host backend, Abort closes the group; a host call in flight ends
// at its own deadline (Config.Timeout) or its Options.Context.
func (c *Communicator) Abort() error {
	if !c.aborted.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	c.endExchanges() // a call's exchange with its peers gives up
	if b := c.book(); b != nil {
		b.stop() // a diagnosis waiting for a peer gives up
	}
	if c.gpu != nil {
		errs = append(errs, c.gpu.releaseKernels())
		// Before the NCCL communicator goes: deregistration needs it.
		errs = append(errs, c.reg.closeAll(true), c.gpu.abortNCCL())
	}
	if c.hier != nil {
		errs = append(errs, c.hier.abort())
	}
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		// The call in flight returns promptly now; wait for it, and for
		// Synchronize, before freeing what they use.
		c.busy.Lock()
		defer c.busy.Unlock()
		c.waiting.Lock()
		defer c.waiting.Unlock()
		var (
			err        error
			freeRegion func() error
		)
		if b := c.book(); b != nil {
			// Peers whose kernels wait for this rank learn why.
			b.tellEnd("aborted")
		}
		if c.gpu != nil {
			freeRegion, err = c.gpu.teardown()
		} else if c.hier != nil {
			err = c.hier.teardown()
		} else {
			err = c.b.close()
		}
		c.waitExchanges()
		c.closeErr = errors.Join(classify(err), c.leave())
		errs = append(errs, c.closeErr)
		if freeRegion != nil {
			go c.freeWhenLeft(freeRegion, parkBound(c.cfg.Timeout))
		}
	})
	return classify(errors.Join(errs...))
}

// exchange runs fn, a store exchange of this rank's with its peers (the
// debug check's fingerprints, UseSymmetric's records), with ctx bounded
// by Config.Timeout and ended as soon as Abort, or a host communicator's
// Close, begins. A GPU caller holds busy, so Abort would otherwise wait
// for it (a GPU Close does wait: the call completes with its peers); a
// host call holds nothing Close waits for, so Close would leave the group
// under it. It returns op's ErrClosed or ErrAborted, without running fn,
// on a communicator closing or aborted, and also where fn failed because
// Close or Abort ended it.
func (c *Communicator) exchange(ctx context.Context, op string, fn func(context.Context) error) error {
	c.exchanging.RLock()
	defer c.exchanging.RUnlock()
	if err := c.gone(op); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if c.ended != nil {
		defer context.AfterFunc(c.ended, cancel)()
	}
	err := fn(ctx)
	if err != nil {
		if gerr := c.gone(op); gerr != nil {
			return gerr
		}
	}
	return err
}

// endExchanges ends the exchanges in progress (exchange): Close or Abort
// has begun.
func (c *Communicator) endExchanges() {
	if c.end != nil {
		c.end()
	}
}

// waitExchanges waits for the exchanges endExchanges ended to return;
// later ones find the communicator gone and touch nothing.
func (c *Communicator) waitExchanges() {
	c.exchanging.Lock()
	c.exchanging.Unlock()
}

// parkBound is how long Abort keeps the staging region for peers still in
// the group: parkFactor x timeout, saturating (a Timeout of "never",
// math.MaxInt64, overflowed to a negative wait and freed the region under
// a live peer's kernel at once).
func parkBound(timeout time.Duration) time.Duration {
	if timeout > math.MaxInt64/parkFactor {
		return math.MaxInt64
	}
	return parkFactor * timeout
}

// gone returns the error of op on an aborted (ErrAborted) or closed
// (ErrClosed) communicator, nil on a live one.
func (c *Communicator) gone(op string) error {
	if c.aborted.Load() {
		return c.abortedError(op)
	}
	if c.closed.Load() {
		return errorf(ErrClosed, "comm: rank %d: %s on a closed communicator", c.cfg.Rank, op)
	}
	return nil
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
// store barrier, once its kernels have ended, except the staging region,
// whose freeing it returns (see freeWhenLeft).
func (g *gpuComm) teardown() (freeRegion func() error, err error) {
	a, ok := g.dev.(aborter)
	if !ok {
		return nil, g.dev.release()
	}
	if !a.drained(g.cfg.Timeout) {
		return nil, errorf(ErrTimeout, "comm: rank %d: a kernel still runs %v after Abort; the communicator's device memory is left allocated (freeing it would wait for the kernel)", g.cfg.Rank, g.cfg.Timeout)
	}
	return a.releaseKeepingRegion()
}

// parkFactor times Config.Timeout bounds how long an aborted rank keeps
// its staging region for peers that have not left: a live peer's kernels
// end by their deadlines (Config.Timeout each), and a peer whose kernel
// timed out is broken and launches no more; the factor leaves room for a
// few collectives it had queued.
const parkFactor = 4

// freeWhenLeft calls free, which frees the aborted rank's staging region,
// once every rank has left the group (the members count is 0: each closed
// or aborted, so none of their kernels still runs) or after at most wait.
// On GPUs free itself then waits until no communicator of this process is
// live on the GPU (parkedGate, case 38).
// Until then a live peer's kernel that signals into the region or reads
// it finds memory there: freed under it, the peer's context faulted
// (CUDA_ERROR_ILLEGAL_ADDRESS, sticky; with goroutine ranks the whole
// process's), where now it times out. An error of free has no caller left
// to see it and is dropped (the region is gone with the process at worst).
// A store the caller closed (rendezvous.ErrClosed) is not asked again: the
// region then waits out the bound, and the store (a file store's
// directory, say) is the caller's to remove.
func (c *Communicator) freeWhenLeft(free func() error, wait time.Duration) {
	defer free()
	deadline := time.Now().Add(wait)
	poll := time.Millisecond
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		n, err := c.members(ctx)
		cancel()
		if err == nil && n <= 0 {
			return
		}
		if errors.Is(err, rendezvous.ErrClosed) {
			time.Sleep(time.Until(deadline))
			return
		}
		time.Sleep(min(poll, time.Until(deadline)))
		poll = min(2*poll, time.Second)
	}
}

// members reads how many ranks still hold a claim on the formation
// without writing: the last member to leave deletes the counter (forget),
// and Add's read made it again. An absent counter is 0.
func (c *Communicator) members(ctx context.Context) (int64, error) {
	// Counters are decimal text: "-" never matches, so nothing is swapped.
	cur, _, err := c.cfg.Store.CompareAndSet(ctx, c.prefix+"members", []byte("-"), []byte("-"))
	if err != nil || cur == nil {
		return 0, err
	}
	return strconv.ParseInt(string(cur), 10, 64)
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
	c.reg.abortNCCL = c.gpu.abortNCCL
	c.reg.join = func(ctx context.Context, note []byte) ([][]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
		return rendezvous.AllGather(ctx, c.cfg.Store, c.prefix+"window", c.cfg.Rank, c.cfg.WorldSize, note)
	}
	// Before 2.19 NCCL cannot register buffers: the allocator is left
	// alone, as when NCCL is not opened, rather than New failing on the
	// ranks whose allocator happens to hold a segment.
	if c.cfg.Allocator != nil && r.noRegister() == "" {
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
