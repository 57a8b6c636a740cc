//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// FuzzPoolOps drives a world-1 pool on the host backend through any
// sequence of Alloc, AllocPersistent, Free (twice too), Rendezvous, Lookup,
// writes and Close: no panic; every refusal after Close is ErrClosed and
// after Free ErrFreed; Lookup finds exactly the live buffers, at the right
// offset, and nothing once they are freed or the pool is closed; a
// persistent id keeps its address across Free and AllocPersistent.
func FuzzPoolOps(f *testing.F) {
	f.Add([]byte{0, 10, 1, 3, 20, 2, 0, 4, 0, 5, 0, 2, 0, 2, 0, 6, 0, 0, 1})
	f.Add([]byte{1, 1, 200, 2, 0, 1, 1, 200, 1, 1, 100, 7, 0, 6})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 300 {
			ops = ops[:300]
		}
		p, err := NewPool(context.Background(), Config{Group: uniqueGroup(t), Rank: 0, WorldSize: 1, Store: rendezvous.NewMemStore(), Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var bufs []*Buffer
		live := map[*Buffer]bool{}
		persistAddr := map[uint64]uintptr{}
		closed := false
		arg := func(i int) int {
			if i < len(ops) {
				return int(ops[i])
			}
			return 0
		}
		pick := func(i int) *Buffer {
			if len(bufs) == 0 {
				return nil
			}
			return bufs[arg(i)%len(bufs)]
		}
		for i := 0; i < len(ops); i += 3 {
			switch ops[i] % 8 {
			case 0, 1: // Alloc or AllocPersistent of 1..65280 bytes
				n := 1 + arg(i+1)*256 + arg(i+2)
				persistent := ops[i]%8 == 1
				id := uint64(arg(i+2) % 4)
				var b *Buffer
				if persistent {
					b, err = p.AllocPersistent(n, id)
				} else {
					b, err = p.Alloc(n)
				}
				switch {
				case closed:
					if !errors.Is(err, ErrClosed) {
						t.Fatalf("alloc after Close: %v, want ErrClosed", err)
					}
				case err != nil:
					if !persistent {
						t.Fatalf("Alloc(%d): %v", n, err)
					}
					// A persistent id still live, or first allocated with
					// another size: refused, and the id's address stands.
				default:
					if b.Size() != n || len(b.Bytes()) != n {
						t.Fatalf("Alloc(%d): Size %d, Bytes %d", n, b.Size(), len(b.Bytes()))
					}
					if persistent {
						if a, seen := persistAddr[id]; seen && a != b.Addr() {
							t.Fatalf("persistent id %d moved from %#x to %#x", id, a, b.Addr())
						}
						persistAddr[id] = b.Addr()
					}
					bufs = append(bufs, b)
					live[b] = true
				}
			case 2, 3: // Free
				b := pick(i + 1)
				if b == nil {
					continue
				}
				err := b.Free()
				if live[b] && !closed && err != nil {
					t.Fatalf("Free of a live buffer: %v", err)
				}
				if !live[b] && !errors.Is(err, ErrFreed) {
					t.Fatalf("second Free: %v, want ErrFreed", err)
				}
				delete(live, b)
			case 4: // Rendezvous (world 1: local)
				if b := pick(i + 1); b != nil {
					_, err := p.Rendezvous(context.Background(), b)
					if live[b] && !closed && err != nil {
						t.Fatalf("Rendezvous of a live buffer: %v", err)
					}
					if (!live[b] || closed) && err == nil {
						t.Fatal("Rendezvous of a freed buffer, or after Close, succeeded")
					}
				}
			case 5: // write through Bytes
				if b := pick(i + 1); b != nil && live[b] {
					mem := b.Bytes()
					mem[arg(i+2)%len(mem)] = ops[i]
				}
			case 6: // Close (again is a no-op)
				if err := p.Close(); err != nil && !closed {
					t.Fatalf("Close: %v", err)
				}
				closed = true
				for b := range live {
					delete(live, b)
				}
			case 7: // nothing: keeps offsets of the other ops varied
			}
			// Lookup finds the live buffers and nothing of the freed ones.
			for _, b := range bufs {
				off := 0
				if b.Size() > 1 {
					off = arg(i+2) % b.Size()
				}
				got, o, ok := Lookup(b.Addr() + uintptr(off))
				switch {
				case live[b] && (!ok || got != b || o != off):
					t.Fatalf("Lookup(%#x+%d) of a live buffer: %v %d %v", b.Addr(), off, got == b, o, ok)
				case !live[b] && ok && !live[got]:
					t.Fatalf("Lookup(%#x) found a freed buffer", b.Addr())
				}
			}
		}
	})
}
