package alloc

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/collgen/collgen/runtime/cuda"
)

// FuzzAllocatorOps drives the caching allocator over the fake driver
// through any sequence of Alloc (three streams, sizes from bytes to
// megabytes), Free (twice too), RecordStream, events passing, event
// recording failing, EmptyCache and a device limit: no panic; live blocks
// never overlap and lie in the driver's live allocations; Stats agree with
// the blocks the caller holds; and once every block is freed and its
// events have passed, EmptyCache returns every byte to the driver.
func FuzzAllocatorOps(f *testing.F) {
	if unsafe.Sizeof(cuda.Stream{}) == 0 {
		f.Skip("without cgo cuda.Stream is empty, so two *cuda.Stream may be equal")
	}
	f.Add([]byte{0, 1, 0, 0, 2, 1, 3, 0, 1, 1, 0, 0, 4, 0, 0, 5, 0, 0})
	f.Add([]byte{0, 200, 1, 2, 0, 2, 6, 0, 0, 1, 0, 0, 7, 0, 0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 300 {
			ops = ops[:300]
		}
		log := &[]string{}
		d := newFake(log)
		a, err := New(d, Options{})
		if err != nil {
			t.Fatal(err)
		}
		streams := []*cuda.Stream{nil, {}, {}}
		var held []*Block // handed out and not freed
		arg := func(i int) int {
			if i < len(ops) {
				return int(ops[i])
			}
			return 0
		}
		for i := 0; i < len(ops); i += 3 {
			switch ops[i] % 8 {
			case 0: // Alloc of 1 B .. ~16 MiB
				n := int64(1+arg(i+1)) << (arg(i+2) % 17)
				b, err := a.Alloc(n, streams[arg(i+2)%3])
				if err != nil {
					var oom *OutOfMemoryError
					if d.limit == 0 || !errors.As(err, &oom) {
						t.Fatalf("Alloc(%d): %v", n, err)
					}
					continue
				}
				if b.Size() < n {
					t.Fatalf("Alloc(%d): a block of %d bytes", n, b.Size())
				}
				held = append(held, b)
			case 1: // Free a held block
				if len(held) == 0 {
					continue
				}
				k := arg(i+1) % len(held)
				if err := a.Free(held[k]); err != nil {
					if !d.failRec {
						t.Fatalf("Free: %v", err)
					}
					continue // still held: the caller may free it again
				}
				held = append(held[:k], held[k+1:]...)
			case 2: // RecordStream of a held block
				if len(held) > 0 {
					if err := a.RecordStream(held[arg(i+1)%len(held)], streams[arg(i+2)%3]); err != nil {
						t.Fatalf("RecordStream: %v", err)
					}
				}
			case 3: // events pass
				for _, e := range d.events {
					e.done = true
				}
			case 4:
				d.failRec = arg(i+1)%2 == 1
			case 5:
				if err := a.EmptyCache(); err != nil {
					t.Fatalf("EmptyCache: %v", err)
				}
			case 6: // a device limit, or none
				d.limit = int64(arg(i+1)) << 20
			case 7: // a freed block again: refused
				if len(held) > 0 {
					b := held[len(held)-1]
					if err := a.Free(b); err != nil {
						if !d.failRec {
							t.Fatalf("Free: %v", err)
						}
						continue
					}
					held = held[:len(held)-1]
					if err := a.Free(b); !errors.Is(err, ErrInvalidArgument) {
						t.Fatalf("second Free: %v, want ErrInvalidArgument", err)
					}
				}
			}
			checkHeld(t, a, d, held)
		}
		// Free everything, let the events pass: nothing stays reserved.
		d.failRec, d.limit = false, 0
		for _, b := range held {
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
		}
		for _, e := range d.events {
			e.done = true
		}
		if err := a.EmptyCache(); err != nil {
			t.Fatal(err)
		}
		if st := a.Stats(); len(d.live) != 0 || st.ReservedBytes != 0 || st.AllocatedBytes != 0 || st.ActiveBlocks != 0 {
			t.Fatalf("after freeing everything: %d driver allocations live, stats %+v", len(d.live), st)
		}
	})
}

// checkHeld checks the held blocks against each other, the driver and
// the allocator's counters.
func checkHeld(t *testing.T, a *Allocator, d *fakeDriver, held []*Block) {
	t.Helper()
	var bytes int64
	for i, b := range held {
		bytes += b.Size()
		inside := false
		for base, n := range d.live {
			if b.Ptr() >= base && b.Ptr()+cuda.DevicePtr(b.Size()) <= base+cuda.DevicePtr(n) {
				inside = true
			}
		}
		if !inside {
			t.Fatalf("block %#x (%d bytes) outside every live driver allocation", uintptr(b.Ptr()), b.Size())
		}
		for _, c := range held[:i] {
			if b.Ptr() < c.Ptr()+cuda.DevicePtr(c.Size()) && c.Ptr() < b.Ptr()+cuda.DevicePtr(b.Size()) {
				t.Fatalf("blocks %#x and %#x overlap", uintptr(b.Ptr()), uintptr(c.Ptr()))
			}
		}
	}
	if st := a.Stats(); st.AllocatedBytes != bytes || st.ActiveBlocks != len(held) {
		t.Fatalf("stats say %d bytes in %d blocks; the caller holds %d bytes in %d", st.AllocatedBytes, st.ActiveBlocks, bytes, len(held))
	}
}
