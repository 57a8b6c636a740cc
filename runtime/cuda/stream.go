//go:build cgo

package cuda

/*
#include "cuda_shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Stream is a CUDA stream of one device. A nil *Stream means the legacy
// default stream (0) wherever a stream is taken. Streams from NewStream are
// non-blocking: they do not synchronise with the legacy default stream, so
// synchronous copies elsewhere never stall or invalidate a capture on them.
type Stream struct {
	dev *Device
	s   C.CUstream
	// bound: work issued through this package has reached s outside a
	// capture, so the driver has given s its hardware work queue (issue).
	bound atomic.Bool
	// capturing: between BeginCapture and EndCapture (work then goes into
	// the graph, not to a queue).
	capturing atomic.Bool
}

// firstWorkMu serialises, process-wide, the first work issued on each
// stream (issue). The driver gives a stream one of its context's hardware
// work queues when the stream's first work arrives. First works arriving
// at once from several OS threads of one context, each followed by more
// work, left one stream's kernels waiting behind another stream's, well
// within CUDA_DEVICE_MAX_CONNECTIONS (whether one queue was given twice is
// not visible from outside). Kernels that wait for each other, as the
// collectives of goroutine ranks sharing a context do, then wait until
// their deadline (reliability case 99: eight ranks on one H100 timed out
// so in 23 of 31 runs; TestFirstLaunchesMeetGPU failed 10 of 12 runs).
// With the first works serialised, neither ever did (0 of 30, 12 of 12
// passed). A first work cannot block on a full queue, so holding the lock
// across it holds another thread's first work only briefly, unless it is
// a launch that grows the context's local memory, which waits for every
// kernel of the context: programs whose kernels wait for each other
// reserve it first (Device.ReserveStack; comm does where ranks share a
// context). Work issued on a stream outside this package (NCCL, a library
// given Handle) is not seen here.
var firstWorkMu sync.Mutex

// issue runs fn, which issues work on s from a thread with s's context
// current, holding firstWorkMu where s may not have its queue yet, and
// returns fn's result. The legacy default stream (nil) is never locked.
func (s *Stream) issue(fn func() C.CUresult) C.CUresult {
	if s == nil || s.bound.Load() {
		return fn()
	}
	firstWorkMu.Lock()
	defer firstWorkMu.Unlock()
	r := fn()
	if r == 0 && !s.capturing.Load() {
		s.bound.Store(true)
	}
	return r
}

const streamNonBlocking = 1 // CU_STREAM_NON_BLOCKING

// NewStream creates a non-blocking stream on d. Destroy it when done.
func (d *Device) NewStream() (*Stream, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	st := &Stream{dev: d}
	if r := C.cg_cuStreamCreate(&st.s, streamNonBlocking); r != 0 {
		return nil, d.err(r, "cuStreamCreate")
	}
	return st, nil
}

// handle returns the CUstream (0 for nil).
func (s *Stream) handle() C.CUstream {
	if s == nil {
		return nil
	}
	return s.s
}

// usable refuses a stream that Destroy released (op names the call): its
// handle is then 0, which CUDA takes for the legacy default stream, so
// work meant for it would run there, ordered with other work than its
// owner expects, and waits would wait for the wrong work. The nil
// *Stream (the legacy stream on purpose) is usable.
func (s *Stream) usable(op string) error {
	if s != nil && s.s == nil {
		dev := -1
		if s.dev != nil {
			dev = s.dev.Ordinal
		}
		return fmt.Errorf("cuda: %s on device %d: the stream was destroyed (Stream.Destroy): %w", op, dev, ErrInvalidArgument)
	}
	return nil
}

// Handle returns the raw CUstream, e.g. for NCCL (a cudaStream_t is the
// same object). 0 for a nil stream, and for a destroyed one: 0 is the
// legacy default stream to CUDA and NCCL, so do not pass on the handle
// of a stream that may have been destroyed.
func (s *Stream) Handle() uintptr {
	if s == nil {
		return 0
	}
	return uintptr(unsafe.Pointer(s.s))
}

// Device returns the stream's device (nil for the nil stream).
func (s *Stream) Device() *Device {
	if s == nil {
		return nil
	}
	return s.dev
}

// Synchronize waits for all work queued on s.
func (s *Stream) Synchronize() error {
	if err := s.usable("cuStreamSynchronize"); err != nil {
		return err
	}
	if err := s.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuStreamSynchronize(s.s); r != 0 {
		return s.dev.err(r, "cuStreamSynchronize")
	}
	return nil
}

// Query reports whether all work queued on s has completed, without
// waiting (cuStreamQuery). A kernel that failed makes it an error.
func (s *Stream) Query() (bool, error) {
	if err := s.usable("cuStreamQuery"); err != nil {
		return false, err
	}
	if err := s.dev.enter(); err != nil {
		return false, err
	}
	defer runtime.UnlockOSThread()
	return s.dev.queryResult(C.cg_cuStreamQuery(s.s), "cuStreamQuery")
}

// queryResult turns a cuStreamQuery or cuEventQuery result into done or
// not, CUDA_ERROR_NOT_READY being "not yet".
func (d *Device) queryResult(r C.CUresult, op string) (bool, error) {
	switch r {
	case 0:
		return true, nil
	case C.CUresult(ErrorNotReady):
		return false, nil
	}
	return false, d.err(r, op)
}

// WaitEvent makes future work on s wait for e (which may be of another
// device).
func (s *Stream) WaitEvent(e *Event) error {
	if err := s.usable("cuStreamWaitEvent"); err != nil {
		return err
	}
	if err := s.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := s.issue(func() C.CUresult { return C.cg_cuStreamWaitEvent(s.s, e.e, 0) }); r != 0 {
		return s.dev.err(r, "cuStreamWaitEvent")
	}
	return nil
}

// Destroy releases the stream (queued work still completes). Idempotent;
// later calls with the stream fail with ErrInvalidArgument. Not safe
// concurrently with other calls on the stream: its owner destroys it
// once nothing else uses it.
func (s *Stream) Destroy() error {
	if s == nil || s.s == nil {
		return nil
	}
	if err := s.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	r := C.cg_cuStreamDestroy(s.s)
	s.s = nil
	if r != 0 {
		return s.dev.err(r, "cuStreamDestroy")
	}
	return nil
}

// Stream capture modes (CUstreamCaptureMode).
const captureModeRelaxed = 2

// BeginCapture starts capturing work queued on s into a graph. The capture
// uses CU_STREAM_CAPTURE_MODE_RELAXED: the other modes require EndCapture
// on the same OS thread as BeginCapture, which Go cannot promise without
// pinning the goroutine, and global mode would also forbid unsafe calls
// (cuMemAlloc, sync copies) in every other goroutine during the capture.
// Relaxed leaves other goroutines free; the capturing code itself must not
// make calls that are illegal during capture (synchronising s, sync copies
// on the legacy stream).
func (s *Stream) BeginCapture() error {
	if err := s.usable("cuStreamBeginCapture"); err != nil {
		return err
	}
	if err := s.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuStreamBeginCapture(s.s, captureModeRelaxed); r != 0 {
		return s.dev.err(r, "cuStreamBeginCapture")
	}
	s.capturing.Store(true)
	return nil
}

// EndCapture ends the capture begun by BeginCapture and returns the graph.
// An invalidated capture is an error. Destroy the graph when done.
func (s *Stream) EndCapture() (*Graph, error) {
	if err := s.usable("cuStreamEndCapture"); err != nil {
		return nil, err
	}
	if err := s.dev.enter(); err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	g := &Graph{dev: s.dev}
	r := C.cg_cuStreamEndCapture(s.s, &g.g)
	s.capturing.Store(false) // ended, even where it failed
	if r != 0 {
		return nil, s.dev.err(r, "cuStreamEndCapture")
	}
	if g.g == nil {
		return nil, fmt.Errorf("cuda: cuStreamEndCapture on device %d: capture produced no graph (invalidated)", s.dev.Ordinal)
	}
	return g, nil
}

// Graph is a captured CUDA graph.
type Graph struct {
	dev *Device
	g   C.CUgraph
}

// Instantiate makes an executable graph. The Graph may be destroyed
// afterwards; the GraphExec is independent of it.
func (g *Graph) Instantiate() (*GraphExec, error) {
	if err := g.dev.enter(); err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	ge := &GraphExec{dev: g.dev}
	if r := C.cg_cuGraphInstantiateWithFlags(&ge.e, g.g, 0); r != 0 {
		return nil, g.dev.err(r, "cuGraphInstantiateWithFlags")
	}
	return ge, nil
}

// Destroy releases the graph. Idempotent.
func (g *Graph) Destroy() error {
	if g == nil || g.g == nil {
		return nil
	}
	if err := g.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	r := C.cg_cuGraphDestroy(g.g)
	g.g = nil
	if r != 0 {
		return g.dev.err(r, "cuGraphDestroy")
	}
	return nil
}

// GraphExec is an instantiated, launchable graph.
type GraphExec struct {
	dev *Device
	e   C.CUgraphExec
}

// Launch enqueues one replay of the graph on s.
func (ge *GraphExec) Launch(s *Stream) error {
	if err := s.usable("cuGraphLaunch"); err != nil {
		return err
	}
	if err := ge.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := s.issue(func() C.CUresult { return C.cg_cuGraphLaunch(ge.e, s.handle()) }); r != 0 {
		return ge.dev.err(r, "cuGraphLaunch")
	}
	return nil
}

// Destroy releases the executable graph. Idempotent.
func (ge *GraphExec) Destroy() error {
	if ge == nil || ge.e == nil {
		return nil
	}
	if err := ge.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	r := C.cg_cuGraphExecDestroy(ge.e)
	ge.e = nil
	if r != 0 {
		return ge.dev.err(r, "cuGraphExecDestroy")
	}
	return nil
}

// Event is a CUDA event with timing enabled.
type Event struct {
	dev *Device
	e   C.CUevent
}

// NewEvent creates a timing event on d. Destroy it when done.
func (d *Device) NewEvent() (*Event, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	ev := &Event{dev: d}
	if r := C.cg_cuEventCreate(&ev.e, 0); r != 0 {
		return nil, d.err(r, "cuEventCreate")
	}
	return ev, nil
}

// Record enqueues the event on s.
func (e *Event) Record(s *Stream) error {
	if err := s.usable("cuEventRecord"); err != nil {
		return err
	}
	if err := e.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := s.issue(func() C.CUresult { return C.cg_cuEventRecord(e.e, s.handle()) }); r != 0 {
		return e.dev.err(r, "cuEventRecord")
	}
	return nil
}

// Synchronize waits until the event has completed.
func (e *Event) Synchronize() error {
	if err := e.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuEventSynchronize(e.e); r != 0 {
		return e.dev.err(r, "cuEventSynchronize")
	}
	return nil
}

// Query reports whether the event has completed, without waiting
// (cuEventQuery).
func (e *Event) Query() (bool, error) {
	if err := e.dev.enter(); err != nil {
		return false, err
	}
	defer runtime.UnlockOSThread()
	return e.dev.queryResult(C.cg_cuEventQuery(e.e), "cuEventQuery")
}

// Destroy releases the event. Idempotent.
func (e *Event) Destroy() error {
	if e == nil || e.e == nil {
		return nil
	}
	if err := e.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	r := C.cg_cuEventDestroy(e.e)
	e.e = nil
	if r != 0 {
		return e.dev.err(r, "cuEventDestroy")
	}
	return nil
}

// ElapsedMS returns the milliseconds between two completed events recorded
// on the same device (synchronize end first).
func ElapsedMS(start, end *Event) (float32, error) {
	if err := start.dev.enter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	var ms C.float
	if r := C.cg_cuEventElapsedTime(&ms, start.e, end.e); r != 0 {
		return 0, start.dev.err(r, "cuEventElapsedTime")
	}
	return float32(ms), nil
}
