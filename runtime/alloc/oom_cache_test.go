package alloc

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/cuda"
)

// TestOOMRetryReusesWaitedBlock: a refused allocation waits for the blocks
// held back for other streams; one of them, once released, fits the
// request inside a segment that still holds other blocks (so it is not
// given back). The allocation must take it instead of failing with an
// *OutOfMemoryError while a fitting free block sits in the cache.
func TestOOMRetryReusesWaitedBlock(t *testing.T) {
	a, d, _ := newTest(t)
	d.limit = 2 << 20 // one segment
	s2 := new(cuda.Stream)
	x := mustAlloc(t, a, 1<<20, nil)
	y := mustAlloc(t, a, 1<<20, nil) // same segment, stays allocated
	if err := a.RecordStream(x, s2); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(x); err != nil { // held back: s2's event has not passed
		t.Fatal(err)
	}
	z, err := a.Alloc(1<<20, nil)
	if err != nil {
		t.Fatalf("1 MiB with a 1 MiB block of the stream held back for another stream (and released by the OOM path's wait): %v", err)
	}
	if z.Ptr() != x.Ptr() {
		t.Errorf("got %#x, want the waited-for block %#x", uintptr(z.Ptr()), uintptr(x.Ptr()))
	}
	for _, b := range []*Block{y, z} {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if len(d.live) != 0 {
		t.Errorf("%d segments left with the driver", len(d.live))
	}
}

// TestOOMRetryEventErrorOnce: an event that fails while a refused
// allocation waits for the blocks held back is reported once by
// EmptyCache, like one that fails anywhere else (the retry that then
// succeeded added the same error to the kept ones a second time).
func TestOOMRetryEventErrorOnce(t *testing.T) {
	d := badEvents{fakeDriver: newFake(&[]string{}), ev: badEvent{wait: errors.New("fake: event wait failed")}}
	d.limit = 4 << 20
	a, err := New(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustAlloc(t, a, 1000, nil) // segment 1
	a.RecordStream(b, new(cuda.Stream))
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	s3 := new(cuda.Stream)
	c := mustAlloc(t, a, 2<<20, s3) // segment 2, cached once freed
	a.Free(c)
	e := mustAlloc(t, a, 2<<20, nil) // refused, waits (fails), gives segment 2 back, retries
	a.Free(e)
	err = a.EmptyCache()
	if n := strings.Count(fmt.Sprint(err), "event wait failed"); n != 1 {
		t.Errorf("EmptyCache: %v\nthe failed event is reported %d times, want once", err, n)
	}
}
