package gpubench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// Peers connects the host sides of a sweep's ranks: one all-gather of a
// small blob, used as barrier, broadcast and error agreement. Each rank has
// its own Peers; every rank calls AllGather the same number of times.
type Peers interface {
	// AllGather returns every rank's blob, indexed by rank, once all
	// ranks have called it, or ctx's error wrapped. The result may be
	// shared with the other ranks: read it, do not modify it.
	AllGather(ctx context.Context, blob []byte) ([][]byte, error)
}

// localGroup is the goroutine-rank implementation: a reusable,
// generation-counted rendezvous in memory (microseconds, no store keys).
type localGroup struct {
	mu      sync.Mutex
	world   int
	arrived int
	blobs   [][]byte
	done    chan struct{} // closed when the current generation completes
	last    [][]byte
}

type localPeer struct {
	g    *localGroup
	rank int
}

// LocalPeers returns one Peers per rank for goroutine ranks of one process.
func LocalPeers(world int) []Peers {
	g := &localGroup{world: world, blobs: make([][]byte, world), done: make(chan struct{})}
	ps := make([]Peers, world)
	for r := range ps {
		ps[r] = &localPeer{g: g, rank: r}
	}
	return ps
}

func (p *localPeer) AllGather(ctx context.Context, blob []byte) ([][]byte, error) {
	g := p.g
	g.mu.Lock()
	g.blobs[p.rank] = blob
	g.arrived++
	done := g.done
	if g.arrived == g.world {
		g.last = g.blobs
		g.blobs = make([][]byte, g.world)
		g.arrived = 0
		g.done = make(chan struct{})
		close(done)
	}
	g.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("rank %d waiting for its peers: %w", p.rank, ctx.Err())
	}
	g.mu.Lock()
	out := g.last
	g.mu.Unlock()
	// Every rank reads g.last before any rank can finish the next round,
	// because the next round needs this rank to arrive first.
	return out, nil
}

// storePeers is the process-rank implementation over a rendezvous store.
type storePeers struct {
	store       rendezvous.Store
	prefix      string
	rank, world int
	n           int
}

// StorePeers returns rank's Peers over a rendezvous store; prefix keeps the
// keys of concurrent sweeps apart.
func StorePeers(s rendezvous.Store, prefix string, rank, world int) Peers {
	return &storePeers{store: s, prefix: prefix, rank: rank, world: world}
}

func (p *storePeers) AllGather(ctx context.Context, blob []byte) ([][]byte, error) {
	p.n++
	return rendezvous.AllGather(ctx, p.store, fmt.Sprintf("%s/%d", p.prefix, p.n), p.rank, p.world, blob)
}

// agree shares every rank's error and returns them joined (nil when all
// succeeded), so every rank takes the same branch afterwards.
func agree(ctx context.Context, p Peers, err error) error {
	msg := ""
	if err != nil {
		msg = err.Error()
		if msg == "" {
			msg = "error"
		}
	}
	all, gerr := p.AllGather(ctx, []byte(msg))
	if gerr != nil {
		return errors.Join(err, gerr)
	}
	var errs []string
	for r, b := range all {
		if len(b) > 0 {
			errs = append(errs, fmt.Sprintf("rank %d: %s", r, b))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

// barrier waits for every rank.
func barrier(ctx context.Context, p Peers) error {
	_, err := p.AllGather(ctx, nil)
	return err
}
