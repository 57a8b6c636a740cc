//go:build linux && (amd64 || arm64) && cgo

package symm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
)

// StreamOrdering is an Ordering that runs signal operations in the order
// of a CUDA stream: PutSignal, WaitSignal and Barrier enqueue a one-block
// kernel (cg_symm_signal) on the stream and return. Nothing waits on the
// host inside an operation, so operations can be captured in CUDA graphs
// and replayed.
//
// Timeouts: the kernel's spins have %globaltimer deadlines; the first one
// that passes writes a report (rank, peer, channel, operation, time
// waited) into status words in host-mapped memory and sets a sticky word
// in device memory, after which every later operation of this ordering
// (and every kernel given its KernelGroup) returns at once. Synchronize
// waits for the stream and turns the report into a *TimeoutError; Err
// reads it without waiting. After a timeout the group is broken (see
// TimeoutError): make a new pool.
//
// Operations of a StreamOrdering must be enqueued by one goroutine at a
// time, in the same order on every rank, like any stream work.
type StreamOrdering struct {
	be     *CUDABackend
	s      *cuda.Stream
	fn     *cuda.Function
	status *cuda.HostBuffer // statusWords words, host-mapped
	broken cuda.DevicePtr   // one word, nonzero after a reported timeout

	mu     sync.Mutex
	err    error // the decoded report, once seen
	closed bool

	// args is the signal kernel's argument buffer, reused by every
	// operation (the driver copies it during the launch, into the graph
	// node under capture too). argsMu keeps two goroutines that break the
	// one-goroutine rule from mixing their arguments; Err and Close do not
	// take it. args is an allocation of its own: cgo checks the whole
	// object a passed pointer points into for Go pointers.
	argsMu sync.Mutex
	args   []byte
}

// NewStreamOrdering returns an ordering on s, a stream of the backend's
// device. It compiles the signal kernel if that has not happened yet (so
// do this before capturing a graph) and allocates the status words. The
// stream stays the caller's; Close the ordering before destroying it.
func (b *CUDABackend) NewStreamOrdering(s *cuda.Stream) (*StreamOrdering, error) {
	if s == nil || s.Device() != b.dev {
		return nil, invalidf("symm: a stream ordering needs a stream of %v (the backend's device), not %v", b.dev, s.Device())
	}
	fn, err := b.signalKernel()
	if err != nil {
		return nil, err
	}
	o := &StreamOrdering{be: b, s: s, fn: fn, args: make([]byte, sigArgsBytes)}
	if o.status, err = b.dev.HostAlloc(4*statusWords, true); err != nil {
		return nil, err
	}
	if o.broken, err = b.dev.Alloc(4); err == nil {
		// Returns with the word zeroed; no device-wide synchronize, which
		// would wait for a peer's signal kernel where ranks share the GPU
		// (and fail while another stream of the device is captured).
		err = b.dev.MemsetD32(o.broken, 0, 1)
	}
	if err != nil {
		o.Close()
		return nil, err
	}
	return o, nil
}

// String names the ordering in errors.
func (o *StreamOrdering) String() string {
	return fmt.Sprintf("stream %#x of device %d", o.s.Handle(), o.be.dev.Ordinal)
}

// Stream is the CUDA stream the ordering enqueues on.
func (o *StreamOrdering) Stream() *cuda.Stream { return o.s }

// Synchronize waits for all work on the stream and then reports the
// first timeout of any operation of this ordering, as Err.
func (o *StreamOrdering) Synchronize() error {
	if err := o.s.Synchronize(); err != nil {
		return err
	}
	return o.Err()
}

// Err returns the first timeout reported by an operation of this
// ordering (or a kernel using its KernelGroup) as a *TimeoutError, or nil
// if none has been reported yet. It does not wait: an operation still
// spinning has reported nothing.
func (o *StreamOrdering) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return o.err
	}
	if o.closed {
		return fmt.Errorf("symm: %v: ordering closed", o)
	}
	if o.status.LoadUint32(0) == 0 {
		return nil
	}
	var w [statusWords]uint32
	for i := range w {
		w[i] = o.status.LoadUint32(4 * i)
	}
	o.err = decodeStatus(w)
	var te *TimeoutError
	if errors.As(o.err, &te) {
		te.Hint = sharedHint(sharedDevice(o.be.dev), cuda.WorkQueues())
	}
	return o.err
}

// sharedHint explains a timeout where backends of this process share the
// GPU (shared: ranks of the process on one GPU, one CUDA context, or one
// rank's two pools); "" otherwise. With fewer than the most hardware work
// queues (queues), a rank's queued signal can hold up the one its peer
// waits for (docs/reliability.md, case 34): the pool cannot refuse such
// ranks up front, since two backends on one GPU may be one rank's two
// pools. Else a peer's call that waits for the whole context (a free, a
// module load, Buffer.Free's device synchronization) held it back (case
// 39).
func sharedHint(shared bool, queues int) string {
	switch {
	case !shared:
		return ""
	case queues > 0 && queues < cuda.MaxWorkQueues:
		return fmt.Sprintf("ranks of this process share this GPU, whose CUDA contexts have %d hardware work queues (%s): a rank's queued signal can hold up the one its peer waits for; start the process with %s=%d",
			queues, cuda.EnvMaxConnections, cuda.EnvMaxConnections, cuda.MaxWorkQueues)
	}
	return "if ranks of this process share this GPU (one CUDA context), a call of the peer's that waits for the whole context while this wait ran (cuMemFree, a module load or unload, Buffer.Free or Pool.Close, which synchronize the device) held it back until this timeout (docs/reliability.md, case 39)"
}

// reset clears a report after the stream has drained, for Now (whose
// operations are synchronous, so a timeout ends with its call).
func (o *StreamOrdering) reset() error {
	if err := o.be.dev.MemsetD32Async(o.broken, 0, 1, o.s); err != nil {
		return err
	}
	if err := o.s.Synchronize(); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range statusWords {
		o.status.StoreUint32(4*i, 0)
	}
	o.err = nil
	return nil
}

// Close frees the status words. Synchronize first: a kernel still running
// would write into freed memory. Idempotent; the stream is not destroyed.
func (o *StreamOrdering) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	o.closed = true
	var errs []error
	if o.status != nil {
		errs = append(errs, o.status.Free())
	}
	if o.broken != 0 {
		errs = append(errs, o.be.dev.Free(o.broken))
	}
	return errors.Join(errs...)
}

// launch enqueues op on the stream.
func (o *StreamOrdering) launch(op *SignalOp) error {
	if len(op.Peers) == 0 {
		return nil // a barrier of one rank
	}
	o.mu.Lock()
	closed := o.closed
	o.mu.Unlock()
	if closed {
		return fmt.Errorf("symm: %s on %v: ordering closed", op.Kind, o)
	}
	o.argsMu.Lock()
	defer o.argsMu.Unlock()
	a, err := signalArgs(o.args, op, uint64(o.status.DevPtr), uint64(o.broken))
	if err != nil {
		return err
	}
	return o.fn.Launch(cuda.Dim3(1), cuda.Dim3(64), 0, o.s, a)
}

// Signal runs op in o: enqueued on a *StreamOrdering of this device, or,
// for Now, on the backend's own stream, waiting for it to finish (a
// timeout is then returned by this call, and the next Now operation
// starts afresh).
func (b *CUDABackend) Signal(o Ordering, op *SignalOp) error {
	switch o := o.(type) {
	case *StreamOrdering:
		if o == nil {
			return invalidf("symm: %s: nil *StreamOrdering (did NewStreamOrdering fail?): pass one from NewStreamOrdering, or symm.Now", op.Kind)
		}
		if o.be.dev != b.dev {
			return invalidf("symm: %s on %v: the stream belongs to another device than the buffer's (%v)", op.Kind, o, b.dev)
		}
		return o.launch(op)
	case now:
		return b.signalNow(op)
	}
	return invalidf("symm: the cuda backend runs signals in a *symm.StreamOrdering or symm.Now, not %v", o)
}

// signalNow runs op on the backend's private stream and waits for it.
// It first waits for all work of the device (cuCtxSynchronize), so that,
// as on the host, everything this rank did before the call is visible to
// a peer once its wait returns; do not use Now while a stream of the
// device is being captured. Where another rank of this process has a
// backend on the same GPU (goroutine ranks sharing one), that wait is
// skipped: it would wait for the other rank's Now kernel, which waits for
// this rank's signal, until the timeout. Such ranks synchronize their own
// streams before a Now signal.
func (b *CUDABackend) signalNow(op *SignalOp) error {
	b.nowMu.Lock()
	defer b.nowMu.Unlock()
	if !sharedDevice(b.dev) {
		if err := b.dev.Synchronize(); err != nil {
			return err
		}
	}
	if b.now == nil {
		s, err := b.dev.NewStream()
		if err != nil {
			return err
		}
		o, err := b.NewStreamOrdering(s)
		if err != nil {
			s.Destroy()
			return err
		}
		b.now = o
	}
	if err := b.now.launch(op); err != nil {
		return err
	}
	err := b.now.Synchronize()
	var te *TimeoutError
	if errors.As(err, &te) {
		if rerr := b.now.reset(); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
	return err
}

// KernelGroup returns the bytes of a cg_symm_group for this handle, to be
// placed in a kernel's argument struct: the device pointer arrays, this
// rank, the world size, the channel count, the deadline of one device
// put, wait or barrier (0: the pool's timeout), and o's status words, so
// that a timeout inside the kernel is reported by o.Synchronize as a
// *TimeoutError. The arrays live until the buffer is freed.
func (h *Handle) KernelGroup(o *StreamOrdering, timeout time.Duration) ([]byte, error) {
	if h.ptrsDev == 0 {
		return nil, invalidf("symm: KernelGroup: the %q backend has no device pointer arrays", h.buf.pool.be.Kind())
	}
	if o == nil {
		return nil, invalidf("symm: KernelGroup: nil *StreamOrdering (did NewStreamOrdering fail?): pass the ordering whose stream runs the kernel")
	}
	if be, ok := h.buf.pool.be.(*CUDABackend); !ok || be.dev != o.be.dev {
		return nil, invalidf("symm: KernelGroup: %v is not on the buffer's device", o)
	}
	b := make([]byte, KernelGroupBytes)
	le := binary.LittleEndian
	le.PutUint64(b[0:], uint64(h.ptrsDev))
	le.PutUint64(b[8:], uint64(h.padsDev))
	le.PutUint64(b[16:], uint64(o.status.DevPtr))
	le.PutUint64(b[24:], uint64(o.broken))
	le.PutUint64(b[32:], uint64(h.bound(timeout).Nanoseconds()))
	le.PutUint32(b[40:], uint32(h.rank))
	le.PutUint32(b[44:], uint32(h.world))
	le.PutUint32(b[48:], uint32(h.channels))
	return b, nil
}

// CompileKernel compiles a user's CUDA C++ source for dev with NVRTC,
// through cache (nil: cuda.DefaultCache), and loads it. The source may
// #include "collgen_symm.cuh" (DeviceHeader) for cg_symm_group,
// cg_symm_put, cg_symm_wait and cg_symm_barrier; options are extra NVRTC
// options ("--std=c++17" is added unless a --std is given). Kernels are
// looked up with Module.Function and launched with Function.Launch, on the
// stream of the StreamOrdering whose KernelGroup they get.
func CompileKernel(ctx context.Context, dev *cuda.Device, name, src string, cache *cuda.Cache, options ...string) (*cuda.Module, error) {
	opts := append([]string(nil), options...)
	std := false
	for _, o := range opts {
		std = std || strings.HasPrefix(o, "--std") || strings.HasPrefix(o, "-std")
	}
	if !std {
		opts = append(opts, "--std=c++17")
	}
	return dev.LoadSource(ctx, cuda.CompileRequest{Name: name, Source: src,
		Headers: map[string]string{DeviceHeaderName: DeviceHeader}, Options: opts}, cache)
}
