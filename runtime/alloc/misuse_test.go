package alloc

import (
	"errors"
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/cuda"
)

// TestStaleHandleRefused: a block freed and handed out again comes out
// under a new handle, so a second Free of the old one is refused and the
// new owner's memory stays allocated. (Before, Alloc reused the handle:
// the second Free succeeded and the next Alloc got the same memory.)
func TestStaleHandleRefused(t *testing.T) {
	a, _, _ := newTest(t)
	x := mustAlloc(t, a, 1000, nil)
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	y := mustAlloc(t, a, 1000, nil)
	if y == x || y.Ptr() != x.Ptr() {
		t.Fatalf("the reuse: handle %p for %p, memory %#x for %#x; want new handle, same memory", y, x, uintptr(y.Ptr()), uintptr(x.Ptr()))
	}
	for _, op := range []func() error{func() error { return a.Free(x) }, func() error { return a.RecordStream(x, nil) }} {
		if err := op(); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "stale handle") {
			t.Errorf("use of the stale handle: %v; want ErrInvalidArgument naming a stale handle", err)
		}
	}
	z := mustAlloc(t, a, 1000, nil)
	if z.Ptr() == y.Ptr() {
		t.Error("the next Alloc got y's memory: the stale Free went through")
	}
	for _, b := range []*Block{y, z} {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if st := a.Stats(); st.ActiveBlocks != 0 {
		t.Errorf("stats after freeing all: %+v", st)
	}
}

// panicObserver panics on its n-th call.
type panicObserver struct{ calls, n int }

func (o *panicObserver) SegmentAllocated(Segment) { o.hit() }
func (o *panicObserver) SegmentFreeing(Segment)   { o.hit() }
func (o *panicObserver) hit() {
	if o.calls++; o.calls == o.n {
		panic("observer failed")
	}
}

// TestObserverPanicLeavesAllocatorWhole: an observer that panics in
// SegmentFreeing (second call) or SegmentAllocated leaves every segment
// listed once, counted and not freed twice; the panic reaches the caller,
// and later EmptyCache and Alloc work. (Before, EmptyCache's in-place list
// rewrite left a segment listed twice and a later EmptyCache freed it
// again; a panic in SegmentAllocated left the segment out of reuse.)
func TestObserverPanicLeavesAllocatorWhole(t *testing.T) {
	a, d, _ := newTest(t)
	var blocks []*Block
	for range 4 {
		blocks = append(blocks, mustAlloc(t, a, 2<<20, nil))
	}
	a.Free(blocks[0])
	a.Free(blocks[2])
	o := &panicObserver{n: 2}
	cancel := a.Observe(o, false)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the observer's panic did not reach EmptyCache's caller")
			}
		}()
		a.EmptyCache()
	}()
	cancel()
	check := func(when string) {
		t.Helper()
		seen := map[cuda.DevicePtr]bool{}
		for _, s := range a.Snapshot() {
			if seen[s.Base] {
				t.Errorf("%s: segment %#x listed twice", when, uintptr(s.Base))
			}
			seen[s.Base] = true
			if _, ok := d.live[s.Base]; !ok {
				t.Errorf("%s: segment %#x listed but freed", when, uintptr(s.Base))
			}
		}
		if st := a.Stats(); st.Segments != len(seen) || st.Segments != len(d.live) {
			t.Errorf("%s: Stats.Segments %d, listed %d, driver holds %d", when, st.Segments, len(seen), len(d.live))
		}
	}
	check("after the panic")
	a.Free(blocks[1])
	a.Free(blocks[3])
	if err := a.EmptyCache(); err != nil {
		t.Fatalf("EmptyCache after the panic: %v", err)
	}
	check("after EmptyCache")

	o = &panicObserver{n: 1}
	cancel = a.Observe(o, false)
	func() {
		defer func() { recover() }()
		a.Alloc(1000, nil)
	}()
	cancel()
	before := d.used()
	b := mustAlloc(t, a, 1000, nil)
	if d.used() != before {
		t.Error("the segment made while the observer panicked was not reused")
	}
	a.Free(b)
	check("after a panic in SegmentAllocated")
}

// TestOOMRetryWaitsForOtherStreams: a refused allocation waits for blocks
// held back for other streams before giving the cache back and retrying,
// as the error's "cache emptied" says. (Before, it retried without them
// and failed where EmptyCache then made room.)
func TestOOMRetryWaitsForOtherStreams(t *testing.T) {
	a, d, _ := newTest(t)
	d.limit = 4 << 20
	s2 := new(cuda.Stream)
	b := mustAlloc(t, a, 2<<20, nil)
	if err := a.RecordStream(b, s2); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	big, err := a.Alloc(4<<20, nil)
	if err != nil {
		t.Fatalf("4 MiB with 2 MiB held back for another stream: %v", err)
	}
	a.Free(big)
	if st := a.Stats(); st.NumOOMRetries != 1 {
		t.Errorf("NumOOMRetries %d, want 1", st.NumOOMRetries)
	}
}

// freeFails fails every Free.
type freeFails struct{ *fakeDriver }

func (freeFails) Free(cuda.DevicePtr) error { return errors.New("fake: free failed") }

// TestOOMWithFailedRelease: when giving the cache back fails too, the
// allocation still retries and its failure is an *OutOfMemoryError
// joining both errors.
func TestOOMWithFailedRelease(t *testing.T) {
	log := &[]string{}
	d := newFake(log)
	d.limit = 2 << 20
	a, err := New(freeFails{d}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustAlloc(t, a, 1<<20, nil)
	a.Free(b)
	_, err = a.Alloc(4<<20, nil)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || !strings.Contains(err.Error(), "free failed") || a.Stats().NumOOMRetries != 1 {
		t.Errorf("Alloc: %v (retries %d); want an *OutOfMemoryError naming the failed free, after a retry", err, a.Stats().NumOOMRetries)
	}
}

// TestOptionsBounds: a SegmentBytes whose rounding could overflow is
// refused (Alloc of 1<<62 bytes returned a 0-byte block with it).
func TestOptionsBounds(t *testing.T) {
	for _, o := range []Options{{MinBlock: 1, SegmentBytes: 1<<63 - 1}, {SegmentBytes: 3 << 61}, {SegmentBytes: MaxSegmentBytes * 2}} {
		if _, err := New(newFake(&[]string{}), o); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("New(%+v): %v; want ErrInvalidArgument", o, err)
		}
	}
	if _, err := New(newFake(&[]string{}), Options{SegmentBytes: MaxSegmentBytes}); err != nil {
		t.Errorf("MaxSegmentBytes refused: %v", err)
	}
}

// badEvent fails Done, Wait or Release.
type badEvent struct{ done, wait, release error }

func (e badEvent) Done() (bool, error) { return false, e.done }
func (e badEvent) Wait() error         { return e.wait }
func (e badEvent) Release() error      { return e.release }

type badEvents struct {
	*fakeDriver
	ev badEvent
}

func (d badEvents) Record(*cuda.Stream) (Event, error) { return d.ev, nil }

// TestEventErrorsDoNotPoison: a block whose event fails is kept out of use
// and its error, naming the block, comes from EmptyCache and Close; Alloc
// on any stream goes on working. (Before, every later Alloc and Close
// failed with the event's error, naming nothing.)
func TestEventErrorsDoNotPoison(t *testing.T) {
	d := badEvents{fakeDriver: newFake(&[]string{}), ev: badEvent{done: errors.New("fake: event query failed"), wait: errors.New("fake: event wait failed")}}
	a, err := New(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustAlloc(t, a, 1000, nil)
	a.RecordStream(b, new(cuda.Stream))
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	for i, s := range []*cuda.Stream{nil, new(cuda.Stream), nil} {
		c, err := a.Alloc(1000, s)
		if err != nil {
			t.Fatalf("alloc %d after the event failed: %v", i, err)
		}
		if c.Ptr() == b.Ptr() {
			t.Fatalf("alloc %d reused the block whose event failed", i)
		}
		a.Free(c)
	}
	err = a.EmptyCache()
	if err == nil || !strings.Contains(err.Error(), "event query failed") || !strings.Contains(err.Error(), "kept out of use") {
		t.Errorf("EmptyCache: %v; want the kept event error naming the block", err)
	}
	if err := a.Close(); err == nil || !strings.Contains(err.Error(), "segment(s)") {
		t.Errorf("Close: %v; want it to name the segment it kept", err)
	}
	if _, err := a.Alloc(1000, nil); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Alloc after Close: %v; want ErrInvalidArgument naming a closed allocator", err)
	}
}

// TestObserveNil: Observe(nil) subscribes nothing, with or without replay,
// and its cancel is harmless; Alloc and EmptyCache work as before.
// (Before, replay panicked at once, and without replay every later new
// segment and every EmptyCache that freed one panicked until cancel.)
func TestObserveNil(t *testing.T) {
	a, _, _ := newTest(t)
	x := mustAlloc(t, a, 1000, nil)
	for _, replay := range []bool{true, false} {
		var cancel func()
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("Observe(nil, %v) panicked: %v", replay, r)
				}
			}()
			cancel = a.Observe(nil, replay)
		}()
		defer cancel()
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("with a nil observer: %v", r)
			}
		}()
		y := mustAlloc(t, a, 8<<20, nil) // a new segment
		for _, b := range []*Block{x, y} {
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.EmptyCache(); err != nil {
			t.Fatal(err)
		}
	}()
	if st := a.Stats(); st.Segments != 0 {
		t.Errorf("after EmptyCache: %+v", st)
	}
}
