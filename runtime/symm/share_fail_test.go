//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// failExport is the host twin whose chunks' Export fails while fail is
// set, as dup does at the descriptor limit (EMFILE).
type failExport struct {
	Backend
	fail atomic.Bool
}

func (f *failExport) Create(addr uintptr, size int) (Chunk, error) {
	c, err := f.Backend.Create(addr, size)
	if err != nil {
		return nil, err
	}
	return failChunk{Chunk: c, be: f}, nil
}

// failChunk is failExport's chunk.
type failChunk struct {
	Chunk
	be *failExport
}

func (c failChunk) Export() (*os.File, error) {
	if c.be.fail.Load() {
		return nil, errors.New("dup: too many open files")
	}
	return c.Chunk.Export()
}

// TestShareFailureBreaksPool: a Rendezvous whose own buffer cannot be
// shared (Export fails) took no collective step while its peers did, so
// this rank's calls no longer meet its peers' in order. The doc says such
// a failure breaks the pool. Before, the pool stayed usable and the
// rank's next Rendezvous silently paired its second buffer with the
// peers' first (same size): both "succeeded" on different buffers.
func TestShareFailureBreaksPool(t *testing.T) {
	be := &failExport{Backend: NewHostBackend()}
	pools := newPools(t, 2, func(r int, c *Config) {
		c.Timeout = 10 * time.Second
		if r == 0 {
			c.Backend = be
		}
	})
	var bufs [2][2]*Buffer
	for r := range 2 {
		for i := range 2 {
			b, err := pools[r].Alloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			bufs[r][i] = b
		}
	}
	be.fail.Store(true)
	if _, err := pools[0].Rendezvous(context.Background(), bufs[0][0]); err == nil {
		t.Fatal("Rendezvous with a failing Export succeeded")
	}
	be.fail.Store(false)
	errs := onRanks(2, func(r int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		// Rank 0 goes on with its second buffer; rank 1 is at its first.
		i := 0
		if r == 0 {
			i = 1
		}
		_, err := pools[r].Rendezvous(ctx, bufs[r][i])
		return err
	})
	if errs[0] == nil && errs[1] == nil {
		t.Fatal("rank 0's second buffer was paired with rank 1's first: both Rendezvous calls succeeded")
	}
	if !errors.Is(errs[0], ErrBroken) {
		t.Errorf("rank 0's Rendezvous after its failed one: %v; want ErrBroken", errs[0])
	}
}
