//go:build cgo

package comm

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/nccl"
)

func init() {
	deviceKinds = append(deviceKinds,
		struct{ cause, kind error }{nccl.ErrTimeout, ErrTimeout},
		struct{ cause, kind error }{nccl.ErrAborted, ErrAborted},
		struct{ cause, kind error }{nccl.ErrMissingSymbol, ErrUnsupported})
}

var _ aborter = (*cudaDevice)(nil)

// abortState is cudaDevice's part for Abort and bounded waits.
type abortState struct {
	aborted     atomic.Bool
	relMu       sync.Mutex   // release and releaseKernels exclude each other
	abortStream *cuda.Stream // made by setup (prepareAbort), freed by release

	ncclPending pendingNCCL // the streams NCCL work went on, not yet seen done
	watch       *ncclWatch  // how a wait for NCCL work is bounded; nil until NCCL opens
}

// wait waits for s like cuStreamSynchronize, but it can be cut short:
// Abort makes it return ErrAborted at once; NCCL's asynchronous error
// (such as a remote rank's failure) aborts the NCCL communicator and
// returns; and when NCCL work is pending on s, Config.Timeout bounds the
// wait, after which the NCCL communicator is aborted (its kernels stop)
// and the error is ErrTimeout. Generated kernels bound themselves.
func (d *cudaDevice) wait(s *cuda.Stream) error {
	return d.ncclPending.waitFor(d.cfg.Rank, s, d.aborted.Load, d.watch)
}

// prepareAbort makes the stream releaseKernels raises the abort word on,
// so that Abort creates nothing: its one driver call is that memset.
// (The memset waited behind a parked region's cuMemFree, which holds the
// driver until every kernel of the context has ended, the one waiting for
// the abort word included; parkedGate keeps such frees away from live
// communicators: docs/reliability.md, case 38.) Called by setup; a device
// whose set-up did not get here launched no kernel to release.
func (d *cudaDevice) prepareAbort() error {
	st, err := d.dev.NewStream() // non-blocking: not ordered after the busy stream
	if err != nil {
		return fmt.Errorf("comm: rank %d: the abort stream: %w", d.cfg.Rank, err)
	}
	d.abortStream = st
	return nil
}

// releaseKernels implements aborter (see there).
func (d *cudaDevice) releaseKernels(abortWord cuda.DevicePtr) error {
	d.aborted.Store(true)
	d.relMu.Lock()
	defer d.relMu.Unlock()
	if d.dev == nil || d.abortStream == nil { // released, or set-up never launched a kernel
		return nil
	}
	if err := d.dev.MemsetD32Async(abortWord, 1, 2, d.abortStream); err != nil {
		return fmt.Errorf("comm: rank %d: abort: raise the abort word: %w", d.cfg.Rank, err)
	}
	return nil
}

// abortNCCL implements aborter.
func (d *cudaDevice) abortNCCL() error {
	d.relMu.Lock()
	defer d.relMu.Unlock()
	if d.comm == nil {
		return nil
	}
	return d.comm.Abort()
}

// drained implements aborter: it polls the device's own stream and every
// stream NCCL work went on (a user's stream with a generated kernel on it
// is the user's to drain, and the kernel ends by its deadline anyway).
func (d *cudaDevice) drained(timeout time.Duration) bool {
	return drainStreams(timeout, ownAnd(d.own, d.ncclPending.all())...)
}

// ownAnd puts a device's own stream (when it has one) before the others.
func ownAnd(own *cuda.Stream, others []queryable) []queryable {
	if own == nil {
		return others
	}
	return append([]queryable{own}, others...)
}

// checkMemory implements registrar: device memory of this rank's GPU
// (cuMemAlloc or VMM; not managed, not host memory), [p, p+bytes) inside
// one allocation.
func (d *cudaDevice) checkMemory(p cuda.DevicePtr, bytes int64) error {
	info, err := d.dev.Pointer(p)
	if err != nil {
		return err
	}
	switch {
	case info.Type == cuda.MemoryUnknown:
		return errorf(ErrInvalidArgument, "comm: rank %d: register %#x: not memory the CUDA driver knows (plain host memory, freed memory, or a reserved address range with nothing mapped there); NCCL registers device memory from cuMemAlloc or the VMM API", d.cfg.Rank, uintptr(p))
	case info.Managed:
		return errorf(ErrInvalidArgument, "comm: rank %d: register %#x: managed (unified) memory; NCCL registers device memory from cuMemAlloc or the VMM API", d.cfg.Rank, uintptr(p))
	case info.Type != cuda.MemoryDevice:
		return errorf(ErrInvalidArgument, "comm: rank %d: register %#x: host memory (memory type %d); NCCL registers device memory from cuMemAlloc or the VMM API", d.cfg.Rank, uintptr(p), info.Type)
	case info.Ordinal != d.dev.Ordinal:
		return errorf(ErrInvalidArgument, "comm: rank %d: register %#x: memory of GPU %d, but this rank's is GPU %d", d.cfg.Rank, uintptr(p), info.Ordinal, d.dev.Ordinal)
	}
	base, size, err := d.dev.AddressRange(p)
	if err != nil {
		return err
	}
	if end := base + cuda.DevicePtr(size); p+cuda.DevicePtr(bytes) > end {
		return errorf(ErrInvalidArgument, "comm: rank %d: register [%#x, %#x): runs past its allocation [%#x, %#x)", d.cfg.Rank, uintptr(p), uintptr(p)+uintptr(bytes), uintptr(base), uintptr(end))
	}
	return nil
}

// register implements registrar (ncclCommRegister).
func (d *cudaDevice) register(p cuda.DevicePtr, bytes int64) (uintptr, error) {
	h, err := d.comm.Register(p, int(bytes))
	return uintptr(h), err
}

// deregister implements registrar (ncclCommDeregister).
func (d *cudaDevice) deregister(h uintptr) error { return d.comm.Deregister(nccl.RegHandle(h)) }

// registerWindow implements registrar (ncclCommWindowRegister).
func (d *cudaDevice) registerWindow(p cuda.DevicePtr, bytes int64) (uintptr, error) {
	w, err := d.comm.WindowRegister(p, int(bytes), nccl.WindowSymmetric)
	return uintptr(w), err
}

// deregisterWindow implements registrar (ncclCommWindowDeregister).
func (d *cudaDevice) deregisterWindow(h uintptr) error {
	return d.comm.WindowDeregister(nccl.Window(h))
}

// noRegister implements registrar.
func (d *cudaDevice) noRegister() string {
	return ncclLacks((*nccl.Lib).Registers, "cannot register buffers (ncclCommRegister, 2.19+)")
}

// noWindows implements registrar.
func (d *cudaDevice) noWindows() string {
	return ncclLacks((*nccl.Lib).HasWindows, "has no windows (2.27+)")
}

// ncclLacks says "NCCL <version> <lacks>" when the loaded NCCL has not
// what has reports (or why none loads), "" otherwise.
func ncclLacks(has func(*nccl.Lib) bool, lacks string) string {
	lib, err := nccl.Load()
	if err != nil {
		return err.Error()
	}
	if !has(lib) {
		return fmt.Sprintf("NCCL %v %s", lib.Version(), lacks)
	}
	return ""
}
