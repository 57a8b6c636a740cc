//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// gpuLike stands in for the GPU backend to show that the pool assumes
// nothing of the host twin: another kind, a 2 MiB granularity as CUDA
// VMM reports, memory the CPU "cannot" address, and signals that run only
// in a stream ordering. It borrows the host twin's memory underneath.
type gpuLike struct {
	Backend
	streamOps atomic.Int64
}

// stream is gpuLike's ordering, as a CUDA stream would be.
type stream struct{ id int }

func (s stream) String() string { return fmt.Sprintf("stream %d", s.id) }

func (*gpuLike) Kind() string         { return "gpulike" }
func (*gpuLike) Granularity() int     { return 2 << 20 }
func (*gpuLike) HostAccessible() bool { return false }

func (g *gpuLike) Signal(o Ordering, op *SignalOp) error {
	if _, ok := o.(stream); !ok {
		return fmt.Errorf("gpulike: signals run on a stream, not %v", o)
	}
	g.streamOps.Add(1)
	return hostSignal(op)
}

func TestAnotherBackend(t *testing.T) {
	bes := []*gpuLike{{Backend: NewHostBackend()}, {Backend: NewHostBackend()}}
	pools := newPools(t, 2, func(r int, c *Config) { c.Backend = bes[r] })
	bufs, hs := allocAll(t, pools, 100)
	for r, b := range bufs {
		if b.chunkSize != 2<<20 {
			t.Errorf("rank %d: chunk of %d bytes, want the backend's granularity", r, b.chunkSize)
		}
		if b.Bytes() != nil || hs[r].PeerBytes(1-r) != nil {
			t.Errorf("rank %d: host slices of memory the backend says the CPU cannot address", r)
		}
	}
	// What a kernel would do through the pointer arrays.
	copy(unsafeBytes(hs[0].BufferPtrs()[1], 100), "from rank 0")
	checkErrs(t, onRanks(2, func(r int) error { return hs[r].Barrier(stream{r}, 0, 0) }))
	if got := string(unsafeBytes(bufs[1].Addr(), 11)); got != "from rank 0" {
		t.Errorf("rank 1's buffer holds %q", got)
	}
	if bes[0].streamOps.Load() != 1 || bes[1].streamOps.Load() != 1 {
		t.Errorf("signal ops on the stream: %d, %d; want 1 each", bes[0].streamOps.Load(), bes[1].streamOps.Load())
	}
	if err := hs[0].Barrier(Now, 0, time.Second); err == nil || !strings.Contains(err.Error(), "stream") {
		t.Errorf("the Now ordering on a stream-only backend: %v", err)
	}
	p, err := pools[0].AllocPersistent(3<<20, 9)
	if err != nil {
		t.Fatal(err)
	}
	if p.chunkSize != 4<<20 {
		t.Errorf("persistent chunk of %d bytes, want 4 MiB", p.chunkSize)
	}
}

func TestBackendKindMismatch(t *testing.T) {
	st := rendezvous.NewMemStore()
	group := uniqueGroup(t)
	errs := onRanks(2, func(r int) error {
		cfg := Config{Group: group, Rank: r, WorldSize: 2, Store: st, Timeout: 20 * time.Second}
		if r == 1 {
			cfg.Backend = &gpuLike{Backend: NewHostBackend()}
		}
		p, err := NewPool(context.Background(), cfg)
		if err == nil {
			p.Close()
		}
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), `"host"`) || !strings.Contains(err.Error(), `"gpulike"`) {
			t.Errorf("rank %d: %v; want a mismatch naming both backends", r, err)
		}
	}
}

// zeroGran is a backend that reports no granularity.
type zeroGran struct{ Backend }

func (zeroGran) Granularity() int { return 0 }

// TestNewPoolRefusesBadGranularity: a Backend whose Granularity is not
// positive is refused by NewPool with ErrInvalidArgument, before anything
// is published. (Before, NewPool accepted it and the first Alloc panicked
// dividing by zero.)
func TestNewPoolRefusesBadGranularity(t *testing.T) {
	cfg := Config{Group: uniqueGroup(t), Rank: 0, WorldSize: 1, Store: rendezvous.NewMemStore(), Backend: zeroGran{NewHostBackend()}}
	p, err := NewPool(context.Background(), cfg)
	if err == nil {
		defer p.Close()
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Alloc panicked: %v", r)
				}
			}()
			p.Alloc(100)
		}()
	}
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "granularity") {
		t.Errorf("NewPool with granularity 0: %v; want ErrInvalidArgument naming the granularity", err)
	}
}
