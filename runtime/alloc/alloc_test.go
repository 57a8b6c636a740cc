package alloc

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/collgen/collgen/runtime/cuda"
)

// fakeDriver hands out made-up addresses and logs every call, so tests see
// the order of driver calls and observer calls in one log.
type fakeDriver struct {
	log     *[]string
	next    cuda.DevicePtr
	live    map[cuda.DevicePtr]int64
	limit   int64 // bytes the "device" holds; 0: unlimited
	events  []*fakeEvent
	failRec bool
}

func newFake(log *[]string) *fakeDriver {
	return &fakeDriver{log: log, next: 0x10_0000_0000, live: map[cuda.DevicePtr]int64{}}
}

func (d *fakeDriver) used() (n int64) {
	for _, b := range d.live {
		n += b
	}
	return n
}

func (d *fakeDriver) Alloc(bytes int64) (cuda.DevicePtr, error) {
	if d.limit > 0 && d.used()+bytes > d.limit {
		*d.log = append(*d.log, fmt.Sprintf("alloc %d refused", bytes))
		return 0, errors.New("fake: out of memory")
	}
	p := d.next
	d.next += cuda.DevicePtr(bytes) + 1<<20
	d.live[p] = bytes
	*d.log = append(*d.log, fmt.Sprintf("alloc %#x %d", uintptr(p), bytes))
	return p, nil
}

func (d *fakeDriver) Free(p cuda.DevicePtr) error {
	if _, ok := d.live[p]; !ok {
		return fmt.Errorf("fake: free of unknown %#x", uintptr(p))
	}
	delete(d.live, p)
	*d.log = append(*d.log, fmt.Sprintf("free %#x", uintptr(p)))
	return nil
}

func (d *fakeDriver) Record(s *cuda.Stream) (Event, error) {
	if d.failRec {
		return nil, errors.New("fake: record failed")
	}
	e := &fakeEvent{}
	d.events = append(d.events, e)
	return e, nil
}

// fakeEvent passes when the test says so; Wait passes it.
type fakeEvent struct{ done, released bool }

func (e *fakeEvent) Done() (bool, error) { return e.done, nil }
func (e *fakeEvent) Wait() error         { e.done = true; return nil }
func (e *fakeEvent) Release() error      { e.released = true; return nil }

// logObserver appends observer calls to the shared log.
type logObserver struct{ log *[]string }

func (o logObserver) SegmentAllocated(s Segment) {
	*o.log = append(*o.log, fmt.Sprintf("observe alloc %#x %d", uintptr(s.Base), s.Bytes))
}
func (o logObserver) SegmentFreeing(s Segment) {
	*o.log = append(*o.log, fmt.Sprintf("observe freeing %#x %d", uintptr(s.Base), s.Bytes))
}

func newTest(t *testing.T) (*Allocator, *fakeDriver, *[]string) {
	t.Helper()
	log := &[]string{}
	d := newFake(log)
	a, err := New(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return a, d, log
}

func mustAlloc(t *testing.T, a *Allocator, n int64, s *cuda.Stream) *Block {
	t.Helper()
	b, err := a.Alloc(n, s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSplitReuseMerge(t *testing.T) {
	a, d, _ := newTest(t)
	x := mustAlloc(t, a, 1000, nil) // rounded to 1024, from a 2 MiB segment
	y := mustAlloc(t, a, 512, nil)
	if len(d.live) != 1 {
		t.Fatalf("%d segments, want one split into blocks", len(d.live))
	}
	if x.Size() != 1024 || y.Ptr() != x.Ptr()+1024 {
		t.Fatalf("x %#x+%d, y %#x: want y right after x", uintptr(x.Ptr()), x.Size(), uintptr(y.Ptr()))
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	// Best fit: a 512-byte request takes... the freed 1024 block is the
	// smallest that fits (the rest of the segment is larger).
	z := mustAlloc(t, a, 100, nil)
	if z.Ptr() != x.Ptr() || z.Size() != 512 {
		t.Errorf("z %#x+%d: want the freed block reused, split to 512", uintptr(z.Ptr()), z.Size())
	}
	for _, b := range []*Block{y, z} {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	snap := a.Snapshot()
	if len(snap) != 1 || len(snap[0].Blocks) != 1 || snap[0].Blocks[0].Allocated || snap[0].Blocks[0].Size != 2<<20 {
		t.Fatalf("after freeing everything the segment should be one free block: %+v", snap)
	}
	// A request larger than a segment gets one of its own, rounded.
	big := mustAlloc(t, a, 5<<20+1, nil)
	if big.Size() != 5<<20+512 || d.live[big.Ptr()] != 6<<20 {
		t.Errorf("big block %d in a %d-byte segment, want %d in %d", big.Size(), d.live[big.Ptr()], 5<<20+512, 6<<20)
	}
}

func TestStatsAndSnapshot(t *testing.T) {
	a, _, _ := newTest(t)
	x := mustAlloc(t, a, 4096, nil)
	y := mustAlloc(t, a, 3<<20, nil)
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	got := a.Stats()
	want := Stats{AllocatedBytes: 3 << 20, ReservedBytes: 2<<20 + 4<<20, ActiveBlocks: 1, Segments: 2,
		PeakAllocatedBytes: 4096 + 3<<20, PeakReservedBytes: 6 << 20, NumAllocs: 2, NumFrees: 1, NumSegmentAllocs: 2}
	if got != want {
		t.Errorf("stats\n%+v\nwant\n%+v", got, want)
	}
	snap := a.Snapshot()
	if len(snap) != 2 {
		t.Fatalf("%d segments", len(snap))
	}
	big := snap[1]
	if snap[0].Base > snap[1].Base {
		big = snap[0]
	}
	wantBlocks := []BlockInfo{{Ptr: y.Ptr(), Size: 3 << 20, Requested: 3 << 20, Allocated: true}, {Ptr: y.Ptr() + 3<<20, Size: 1 << 20}}
	if !reflect.DeepEqual(big.Blocks, wantBlocks) {
		t.Errorf("big segment blocks %+v, want %+v", big.Blocks, wantBlocks)
	}
	checkTiling(t, a)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if s := a.Stats(); s.Segments != 1 || s.ReservedBytes != 4<<20 || s.NumSegmentFrees != 1 {
		t.Errorf("after EmptyCache: %+v, want only y's segment", s)
	}
	if err := a.Close(); err == nil || !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "1 blocks") {
		t.Errorf("Close with y allocated: %v, want ErrInvalidArgument", err)
	}
	a.Free(y)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	frees := a.Stats().NumSegmentFrees
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	if s := a.Stats(); s.NumSegmentFrees != frees {
		t.Errorf("second Close freed segments: %+v", s)
	}
}

// TestObserverOrder: observers see a segment after the driver allocates
// it and before the driver frees it; replay reports existing segments once.
func TestObserverOrder(t *testing.T) {
	a, _, log := newTest(t)
	x := mustAlloc(t, a, 100, nil)
	cancel := a.Observe(logObserver{log}, true) // replays x's segment
	y := mustAlloc(t, a, 3<<20, nil)
	a.Free(x)
	a.Free(y)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	cancel()
	cancel()
	z := mustAlloc(t, a, 100, nil)
	a.Free(z)
	a.EmptyCache()
	xs, ys, zs := uintptr(0x10_0000_0000), uintptr(0x10_0000_0000+3<<20), uintptr(0x10_0000_0000+3<<20+5<<20)
	want := []string{
		fmt.Sprintf("alloc %#x %d", xs, 2<<20),
		fmt.Sprintf("observe alloc %#x %d", xs, 2<<20), // replay
		fmt.Sprintf("alloc %#x %d", ys, 4<<20),
		fmt.Sprintf("observe alloc %#x %d", ys, 4<<20),
		fmt.Sprintf("observe freeing %#x %d", xs, 2<<20),
		fmt.Sprintf("free %#x", xs),
		fmt.Sprintf("observe freeing %#x %d", ys, 4<<20),
		fmt.Sprintf("free %#x", ys),
		fmt.Sprintf("alloc %#x %d", zs, 2<<20), // cancelled: no observer lines
		fmt.Sprintf("free %#x", zs),
	}
	if !reflect.DeepEqual(*log, want) {
		t.Errorf("log\n%s\nwant\n%s", strings.Join(*log, "\n"), strings.Join(want, "\n"))
	}
}

// TestStreams: blocks are reused only on their own stream; a block used on
// another stream comes back only after that stream's event passes.
func TestStreams(t *testing.T) {
	if unsafe.Sizeof(cuda.Stream{}) == 0 {
		t.Skip("without cgo cuda.Stream is empty, so two *cuda.Stream may be equal")
	}
	a, d, _ := newTest(t)
	s1, s2 := &cuda.Stream{}, &cuda.Stream{}
	x := mustAlloc(t, a, 4096, s1)
	a.Free(x)
	y := mustAlloc(t, a, 4096, s2)
	if y.Ptr() == x.Ptr() || len(d.live) != 2 || y.Stream() != s2 {
		t.Fatalf("a block of s1 was given to s2 (%d segments)", len(d.live))
	}
	// Used on s1 too: held back until s1's event passes.
	if err := a.RecordStream(y, s1); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(y); err != nil {
		t.Fatal(err)
	}
	if len(d.events) != 1 {
		t.Fatalf("%d events recorded, want 1 (on s1)", len(d.events))
	}
	z := mustAlloc(t, a, 4096, s2)
	if z.Ptr() == y.Ptr() {
		t.Fatal("reused a block before the other stream's event passed")
	}
	if err := a.Free(y); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "already freed") {
		t.Errorf("second free of a pending block: %v", err)
	}
	d.events[0].done = true
	w := mustAlloc(t, a, 4096, s2)
	if w.Ptr() != y.Ptr() || !d.events[0].released {
		t.Errorf("after the event passed: got %#x, want y's block %#x reused and the event released", uintptr(w.Ptr()), uintptr(y.Ptr()))
	}
	if err := a.RecordStream(w, s2); err != nil { // its own stream: nothing to wait for
		t.Fatal(err)
	}
	a.Free(w)
	if len(d.events) != 1 {
		t.Errorf("freeing a block used only on its own stream recorded an event")
	}
	d.failRec = true
	a.RecordStream(z, s1)
	before := a.Stats()
	if err := a.Free(z); err == nil || !strings.Contains(err.Error(), "record event") {
		t.Errorf("free with a failing event record: %v", err)
	}
	// The block stays allocated and counted, and a later Free succeeds
	// (the counters went negative when that Free counted it a second
	// time; found by FuzzAllocatorOps).
	if st := a.Stats(); st.AllocatedBytes != before.AllocatedBytes || st.ActiveBlocks != before.ActiveBlocks || st.NumFrees != before.NumFrees {
		t.Errorf("a failed Free changed the counters: %+v, before %+v", st, before)
	}
	d.failRec = false
	if err := a.Free(z); err != nil {
		t.Errorf("Free after the failed one: %v", err)
	}
	if st := a.Stats(); st.ActiveBlocks != before.ActiveBlocks-1 || st.AllocatedBytes != before.AllocatedBytes-z.Size() {
		t.Errorf("after the second Free: %+v, before %+v", st, before)
	}
}

func TestMisuse(t *testing.T) {
	a, _, _ := newTest(t)
	b := mustAlloc(t, a, 10, nil)
	for _, n := range []int64{0, -1, 1<<62 + 1} {
		if _, err := a.Alloc(n, nil); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Alloc(%d): %v, want ErrInvalidArgument", n, err)
		}
	}
	a.Free(b)
	if err := a.Free(b); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "already freed") {
		t.Errorf("double free: %v", err)
	}
	other, _, _ := newTest(t)
	c := mustAlloc(t, other, 10, nil)
	if err := a.Free(c); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "not from this allocator") {
		t.Errorf("foreign free: %v", err)
	}
	if err := a.Free(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil free: %v", err)
	}
	if _, err := New(nil, Options{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil driver: %v", err)
	}
	if _, err := New(newFake(&[]string{}), Options{MinBlock: 500}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("MinBlock 500: %v", err)
	}
}

// TestOutOfMemory: a refused allocation empties the cache (observers told
// first) and retries; a second refusal is an OutOfMemoryError.
func TestOutOfMemory(t *testing.T) {
	a, d, log := newTest(t)
	d.limit = 6 << 20
	x := mustAlloc(t, a, 4<<20, nil)
	a.Free(x) // cached: 4 MiB reserved
	a.Observe(logObserver{log}, false)
	y := mustAlloc(t, a, 5<<20, nil) // 6 MiB segment: needs x's back
	if s := a.Stats(); s.NumOOMRetries != 1 || s.Segments != 1 {
		t.Errorf("stats %+v, want one retry and one segment", s)
	}
	tail := (*log)[len(*log)-5:]
	if !strings.HasSuffix(tail[0], "refused") || !strings.HasPrefix(tail[1], "observe freeing") || !strings.HasPrefix(tail[2], "free ") || !strings.HasPrefix(tail[3], "alloc ") {
		t.Errorf("log tail %q: want refused, observe freeing, free, alloc, observe alloc", tail)
	}
	_, err := a.Alloc(2<<20, nil)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || oom.Reserved != 6<<20 || !strings.Contains(err.Error(), "out of device memory") {
		t.Errorf("over the limit: %v", err)
	}
	a.Free(y)
}

// checkTiling asserts every segment's blocks tile it in address order and
// no two free blocks are neighbours (they would have been merged).
func checkTiling(t *testing.T, a *Allocator) {
	t.Helper()
	for _, seg := range a.Snapshot() {
		at := seg.Base
		for i, b := range seg.Blocks {
			if b.Ptr != at {
				t.Fatalf("segment %#x: block %d at %#x, want %#x", uintptr(seg.Base), i, uintptr(b.Ptr), uintptr(at))
			}
			if i > 0 && !b.Allocated && !seg.Blocks[i-1].Allocated {
				t.Fatalf("segment %#x: free blocks %d and %d not merged", uintptr(seg.Base), i-1, i)
			}
			at += cuda.DevicePtr(b.Size)
		}
		if at != seg.Base+cuda.DevicePtr(seg.Bytes) {
			t.Fatalf("segment %#x: blocks end at %#x, segment at %#x", uintptr(seg.Base), uintptr(at), uintptr(seg.Base)+uintptr(seg.Bytes))
		}
	}
}

// TestConcurrent: goroutines allocating and freeing on their own streams
// leave consistent segments and no allocated bytes (run with -race).
func TestConcurrent(t *testing.T) {
	a, d, _ := newTest(t) // the allocator's lock serialises driver calls
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &cuda.Stream{}
			var live []*Block
			for i := 0; i < 300; i++ {
				if len(live) > 0 && (i%3 == 0 || len(live) > 20) {
					k := (i * 7) % len(live)
					if err := a.Free(live[k]); err != nil {
						t.Error(err)
						return
					}
					live = append(live[:k], live[k+1:]...)
					continue
				}
				b, err := a.Alloc(int64(1+(i*977+g*131)%(3<<20)), s)
				if err != nil {
					t.Error(err)
					return
				}
				live = append(live, b)
			}
			for _, b := range live {
				a.Free(b)
			}
		}()
	}
	wg.Wait()
	checkTiling(t, a)
	if s := a.Stats(); s.AllocatedBytes != 0 || s.ActiveBlocks != 0 || s.NumAllocs != s.NumFrees {
		t.Errorf("stats after everything was freed: %+v", s)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if len(d.live) != 0 {
		t.Errorf("%d segments not given back", len(d.live))
	}
}
