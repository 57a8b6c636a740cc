//go:build linux && (amd64 || arm64)

package symm

import (
	"errors"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/collgen/collgen/internal/pause"
)

// ptrAt turns an address of memory outside the Go heap (a mapping made by
// a Backend) into a pointer. The garbage collector ignores such pointers,
// and the memory stays mapped while its Buffer or Handle is live; the
// double indirection only keeps vet from taking it for a heap pointer
// smuggled through a uintptr.
func ptrAt(addr uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&addr)) }

// word is the signal word at addr.
func word(addr uintptr) *uint32 { return (*uint32)(ptrAt(addr)) }

// hostSignal runs op with CPU atomics on the calling goroutine. Go's
// atomics are sequentially consistent, which includes the release (put)
// and acquire (wait) ordering the protocol needs; on shared mappings they
// order stores between processes too: they are hardware instructions on
// the physical memory (x86 LOCK CMPXCHG; arm64 CASAL, or LDAXR/STLXR
// without LSE), not locks private to this process.
func hostSignal(op *SignalOp) error {
	start := time.Now()
	deadline := start.Add(op.Timeout)
	timeout := func(i int, consume bool) error {
		return &TimeoutError{Op: op.Kind, Rank: op.Rank, Peer: op.Peers[i], Channel: op.Channel, Waited: time.Since(start), Consume: consume}
	}
	if op.Kind == SignalPut || op.Kind == SignalBarrier {
		for i, a := range op.Put {
			if ok, stopped := spin(word(a), 0, 1, deadline, op.stop); stopped {
				return errSignalStopped
			} else if !ok {
				return timeout(i, true)
			}
		}
	}
	if op.Kind == SignalWait || op.Kind == SignalBarrier {
		for i, a := range op.Wait {
			if ok, stopped := spin(word(a), 1, 0, deadline, op.stop); stopped {
				return errSignalStopped
			} else if !ok {
				return timeout(i, false)
			}
		}
	}
	return nil
}

// errSignalStopped is hostSignal's error when the buffer's Free or its
// pool's Close ended a wait (SignalOp.stop); Handle.signal reports it as
// ErrFreed.
var errSignalStopped = errors.New("symm: signal operation ended by the buffer's free")

// spin swaps *w from old to new, retrying until deadline: first busily (a
// peer on another core answers within microseconds), then yielding, then
// sleeping up to 100µs between tries so that waiting ranks do not starve
// the ones they wait for on a machine with fewer cores than ranks. It makes
// one last try at the deadline, so a signal that arrived during the final
// sleep still counts. It gives up (stopped) once *stop is non-zero.
func spin(w *uint32, old, new uint32, deadline time.Time, stop *atomic.Int32) (ok, stopped bool) {
	sleep := time.Microsecond
	for i := 0; ; i++ {
		if atomic.CompareAndSwapUint32(w, old, new) {
			return true, false
		}
		if stop != nil && stop.Load() != 0 {
			return false, true
		}
		switch {
		case i < 64:
		case i < 128:
			runtime.Gosched()
		default:
			left := time.Until(deadline)
			if left <= 0 {
				return atomic.CompareAndSwapUint32(w, old, new), false
			}
			pause.For(min(sleep, left))
			sleep = min(2*sleep, 100*time.Microsecond)
		}
	}
}
