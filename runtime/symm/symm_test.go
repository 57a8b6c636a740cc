//go:build linux && (amd64 || arm64)

package symm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/collgen/collgen/internal/meminfo"
	"github.com/collgen/collgen/runtime/fdpass"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

func TestAllocLookupFree(t *testing.T) {
	p := newPools(t, 1, nil)[0]
	for _, n := range []int{0, -1, MaxAllocBytes + 1, math.MaxInt} {
		if _, err := p.Alloc(n); err == nil || !strings.Contains(err.Error(), "at most") {
			t.Errorf("Alloc(%d): %v, want a refusal naming the bound", n, err)
		}
	}
	b, err := p.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	mem := b.Bytes()
	if len(mem) != 1000 || b.Size() != 1000 || b.Addr() == 0 {
		t.Fatalf("buffer of %d bytes at %#x, Size %d", len(mem), b.Addr(), b.Size())
	}
	if !bytes.Equal(mem, make([]byte, 1000)) {
		t.Error("new buffer is not zeroed")
	}
	for i := range mem {
		mem[i] = byte(i)
	}
	if got, off, ok := Lookup(b.Addr() + 10); !ok || got != b || off != 10 {
		t.Errorf("Lookup(addr+10) = %p, %d, %v; want the buffer at offset 10", got, off, ok)
	}
	if got, _, ok := Lookup(b.Addr() + 1000); ok && got == b {
		t.Error("Lookup found the buffer one past its end")
	}
	if got, _, ok := Lookup(b.Addr() - 1); ok && got == b {
		t.Error("Lookup found the buffer one before its start")
	}
	if _, ok := b.ID(); ok {
		t.Error("a plain allocation has a persistent id")
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if got, _, ok := Lookup(b.Addr()); ok && got == b {
		t.Error("Lookup still finds a freed buffer")
	}
	if b.Bytes() != nil {
		t.Error("Bytes of a freed buffer is not nil")
	}
	if err := b.Free(); !errors.Is(err, ErrFreed) {
		t.Errorf("second Free: %v, want ErrFreed", err)
	}
}

func TestLookupMatchesScan(t *testing.T) {
	p := newPools(t, 1, nil)[0]
	var bufs []*Buffer
	for i := 0; i < 64; i++ {
		b, err := p.Alloc(1 + i*97)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	for i := 0; i < len(bufs); i += 3 {
		if err := bufs[i].Free(); err != nil {
			t.Fatal(err)
		}
	}
	for i, b := range bufs {
		live := i%3 != 0
		for _, off := range []int{0, b.Size() / 2, b.Size() - 1} {
			got, gotOff, ok := Lookup(b.Addr() + uintptr(off))
			if live && (!ok || got != b || gotOff != off) {
				t.Errorf("buffer %d offset %d: Lookup = %p, %d, %v", i, off, got, gotOff, ok)
			}
			if !live && ok && got == b {
				t.Errorf("freed buffer %d found", i)
			}
		}
	}
}

func TestLookupAllocatesNothing(t *testing.T) {
	p := newPools(t, 1, nil)[0]
	b, err := p.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	var sink atomic.Int64
	n := testing.AllocsPerRun(1000, func() {
		_, off, _ := Lookup(b.Addr() + 7)
		sink.Add(int64(off))
	})
	if n != 0 {
		t.Errorf("Lookup allocates %v times per call", n)
	}
}

func TestPersistent(t *testing.T) {
	p := newPools(t, 1, nil)[0]
	a, err := p.AllocPersistent(5000, 7)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := a.ID(); !ok || id != 7 {
		t.Errorf("ID() = %d, %v", id, ok)
	}
	copy(a.Bytes(), "old contents")
	if _, err := p.AllocPersistent(5000, 7); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second allocation of a live id: %v", err)
	}
	other, err := p.AllocPersistent(5000, 8)
	if err != nil {
		t.Fatal(err)
	}
	if other.Addr() == a.Addr() {
		t.Error("two ids share an address")
	}
	addr := a.Addr()
	if err := a.Free(); err != nil {
		t.Fatal(err)
	}
	_, err = p.AllocPersistent(6000, 7)
	if err == nil || !strings.Contains(err.Error(), "5000") || !strings.Contains(err.Error(), "6000") {
		t.Errorf("size change of id 7: %v, want an error naming 5000 and 6000", err)
	}
	b, err := p.AllocPersistent(5000, 7)
	if err != nil {
		t.Fatal(err)
	}
	if b.Addr() != addr {
		t.Errorf("id 7 moved from %#x to %#x", addr, b.Addr())
	}
	if !bytes.Equal(b.Bytes(), make([]byte, 5000)) {
		t.Error("re-allocated persistent buffer holds the old memory, not new zeroed memory")
	}
	if got, _, ok := Lookup(addr); !ok || got != b {
		t.Error("Lookup does not find the re-allocated buffer")
	}
}

func TestRendezvousPeersAndCache(t *testing.T) {
	const world, n = 3, 1 << 16
	pools := newPools(t, world, nil)
	bufs, hs := allocAll(t, pools, n)
	checkErrs(t, onRanks(world, func(r int) error {
		h := hs[r]
		again, err := pools[r].Rendezvous(context.Background(), bufs[r])
		if err != nil || again != h || bufs[r].Handle() != h {
			return fmt.Errorf("second Rendezvous: %p, %v; want the cached %p", again, err, h)
		}
		ptrs, pads := h.BufferPtrs(), h.SignalPadPtrs()
		if len(ptrs) != world || ptrs[r] != bufs[r].Addr() || h.Peer(r) != bufs[r].Addr() || len(pads) != world {
			return fmt.Errorf("pointer arrays %x, %x", ptrs, pads)
		}
		for q := range world {
			if q != r && (ptrs[q] == bufs[q].Addr() || pads[q] <= ptrs[q] || pads[q]-ptrs[q] < n) {
				return fmt.Errorf("rank %d's buffer at %#x pad %#x: want a mapping of its own, pad after the buffer", q, ptrs[q], pads[q])
			}
		}
		// Each rank fills its own buffer, then writes its rank into a slot
		// of every peer's buffer.
		mem := bufs[r].Bytes()
		for i := 0; i < n/2; i++ {
			mem[i] = byte(r + 1)
		}
		for q := range world {
			h.PeerBytes(q)[n/2+r] = byte(100 + r)
		}
		if err := h.Barrier(Now, 0, 0); err != nil {
			return err
		}
		for q := range world {
			pm := h.PeerBytes(q)
			if pm[0] != byte(q+1) || pm[n/2-1] != byte(q+1) {
				return fmt.Errorf("rank %d's buffer reads %d, %d; want %d", q, pm[0], pm[n/2-1], q+1)
			}
			if mem[n/2+q] != byte(100+q) {
				return fmt.Errorf("slot %d of own buffer holds %d; rank %d wrote %d", q, mem[n/2+q], q, 100+q)
			}
		}
		// Nobody frees before everyone has read.
		return h.Barrier(Now, 0, 0)
	}))
}

func TestRendezvousSizeMismatch(t *testing.T) {
	pools := newPools(t, 2, nil)
	errs := onRanks(2, func(r int) error {
		b, err := pools[r].Alloc(4096 * (r + 1))
		if err != nil {
			return err
		}
		_, err = pools[r].Rendezvous(context.Background(), b)
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "4096") || !strings.Contains(err.Error(), "8192") {
			t.Errorf("rank %d: %v; want a mismatch naming 4096 and 8192", r, err)
		}
	}
}

func TestNewPoolMismatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(r int, c *Config)
		words []string
	}{
		{"world", func(r int, c *Config) { c.WorldSize = 2 + r }, []string{"world size 2", "world size 3"}},
		{"channels", func(r int, c *Config) { c.Channels = 8 << r }, []string{"channel count 8", "channel count 16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := rendezvous.NewMemStore()
			group := uniqueGroup(t)
			errs := onRanks(2, func(r int) error {
				cfg := Config{Group: group, Rank: r, WorldSize: 2, Store: st, Timeout: 20 * time.Second}
				tc.edit(r, &cfg)
				p, err := NewPool(context.Background(), cfg)
				if err == nil {
					p.Close()
				}
				return err
			})
			for r, err := range errs {
				if !errors.Is(err, ErrMismatch) {
					t.Errorf("rank %d: %v, want ErrMismatch", r, err)
					continue
				}
				for _, w := range tc.words {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("rank %d: %v does not name %q", r, err, w)
					}
				}
			}
		})
	}
}

// TestNewPoolGroupMismatch starts rank 0 in one group and rank 1 in
// another: the group names a namespace, so they cannot meet, but both time
// out with an error naming both groups. It wraps ErrTimeout only: a rank
// number is in several groups of a store (two tensor-parallel groups), so
// the other group is a hint, not a proven disagreement.
func TestNewPoolGroupMismatch(t *testing.T) {
	st := rendezvous.NewMemStore()
	groups := []string{uniqueGroup(t) + "-tp", uniqueGroup(t) + "-dp"}
	errs := onRanks(2, func(r int) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p, err := NewPool(ctx, Config{Group: groups[r], Rank: r, WorldSize: 2, Store: st})
		if err == nil {
			p.Close()
		}
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrMismatch) ||
			!strings.Contains(err.Error(), groups[0]) || !strings.Contains(err.Error(), groups[1]) {
			t.Errorf("rank %d: %v; want a timeout (not a mismatch) naming both groups", r, err)
		}
	}
}

func TestNewPoolMissingRank(t *testing.T) {
	st := rendezvous.NewMemStore()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := NewPool(ctx, Config{Group: uniqueGroup(t), Rank: 0, WorldSize: 3, Store: st})
	var mre *rendezvous.MissingRanksError
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &mre) || len(mre.Missing) != 2 {
		t.Fatalf("got %v; want a timeout naming ranks 1 and 2", err)
	}
}

func TestRendezvousMissingRank(t *testing.T) {
	pools := newPools(t, 2, nil)
	b, err := pools[0].Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = pools[0].Rendezvous(ctx, b)
	var mre *rendezvous.MissingRanksError
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &mre) || len(mre.Missing) != 1 || mre.Missing[0] != 1 {
		t.Fatalf("got %v; want a timeout naming rank 1", err)
	}
	if b.Handle() != nil {
		t.Error("a failed rendezvous left a handle")
	}
}

func TestRendezvousRefusals(t *testing.T) {
	a := newPools(t, 1, nil)[0]
	b := newPools(t, 1, nil)[0]
	buf, err := b.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Rendezvous(context.Background(), buf); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("another pool's buffer: %v", err)
	}
	if _, err := a.Rendezvous(context.Background(), nil); !errors.Is(err, ErrNotFromPool) {
		t.Errorf("nil buffer: %v", err)
	}
	buf.Free()
	if _, err := b.Rendezvous(context.Background(), buf); !errors.Is(err, ErrFreed) {
		t.Errorf("freed buffer: %v", err)
	}
	// Freed after a Rendezvous: the handle stays set, and a repeat
	// Rendezvous must still refuse (it returned the stale handle; found by
	// FuzzPoolOps).
	buf, err = b.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Rendezvous(context.Background(), buf); err != nil {
		t.Fatal(err)
	}
	buf.Free()
	if h, err := b.Rendezvous(context.Background(), buf); !errors.Is(err, ErrFreed) || h != nil {
		t.Errorf("freed after a rendezvous: handle %v, %v; want ErrFreed", h != nil, err)
	}
}

func TestSignalPingPong(t *testing.T) {
	pools := newPools(t, 2, nil)
	bufs, hs := allocAll(t, pools, 8)
	const rounds = 200
	checkErrs(t, onRanks(2, func(r int) error {
		h, peer := hs[r], 1-r
		for i := 0; i < rounds; i++ {
			if (i%2 == 0) == (r == 0) {
				// Plain store, then put: the put's release orders it.
				h.PeerBytes(peer)[0] = byte(i)
				if err := h.PutSignal(Now, peer, 5, 0); err != nil {
					return err
				}
				continue
			}
			if err := h.WaitSignal(Now, peer, 5, 0); err != nil {
				return err
			}
			if got := bufs[r].Bytes()[0]; got != byte(i) {
				return fmt.Errorf("round %d: read %d after the wait", i, got)
			}
		}
		return nil
	}))
}

func TestSignalTimeouts(t *testing.T) {
	pools := newPools(t, 2, nil)
	_, hs := allocAll(t, pools, 64)
	const d = 50 * time.Millisecond

	err := hs[1].WaitSignal(Now, 0, 3, d)
	var te *TimeoutError
	if !errors.As(err, &te) || !errors.Is(err, ErrTimeout) || te.Rank != 1 || te.Peer != 0 || te.Channel != 3 || te.Op != SignalWait || te.Consume {
		t.Errorf("wait for a silent peer: %#v", err)
	}
	if err != nil && (!strings.Contains(err.Error(), "rank 0") || !strings.Contains(err.Error(), "channel 3")) {
		t.Errorf("message %q does not name the peer and channel", err)
	}

	// A second put before the peer consumed the first one waits for it.
	if err := hs[0].PutSignal(Now, 1, 4, d); err != nil {
		t.Fatal(err)
	}
	err = hs[0].PutSignal(Now, 1, 4, d)
	if !errors.As(err, &te) || te.Peer != 1 || te.Channel != 4 || !te.Consume || te.Op != SignalPut {
		t.Errorf("put into a full word: %v", err)
	}
	if err := hs[1].WaitSignal(Now, 0, 4, d); err != nil {
		t.Errorf("the first put's signal: %v", err)
	}

	if err := hs[0].PutSignal(Now, 2, 0, d); err == nil {
		t.Error("put to rank 2 of 2")
	}
	if err := hs[0].WaitSignal(Now, 1, DefaultChannels, d); err == nil {
		t.Error("wait on a channel past the last")
	}
	if err := hs[0].PutSignal(nil, 1, 0, d); err == nil {
		t.Error("the host twin accepted an ordering other than Now")
	}
}

func TestBarrierRounds(t *testing.T) {
	const world, rounds = 4, 100
	pools := newPools(t, world, nil)
	bufs, hs := allocAll(t, pools, 64)
	checkErrs(t, onRanks(world, func(r int) error {
		h := hs[r]
		for i := 0; i < rounds; i++ {
			bufs[r].Bytes()[0] = byte(i)
			if err := h.Barrier(Now, i%3, 0); err != nil {
				return err
			}
			for q := range world {
				if got := h.PeerBytes(q)[0]; got != byte(i) {
					return fmt.Errorf("round %d: rank %d's buffer holds %d", i, q, got)
				}
			}
			// No rank overwrites its value before all have read it.
			if err := h.Barrier(Now, 3, 0); err != nil {
				return err
			}
		}
		return nil
	}))
}

func TestBarrierTimeoutNamesAbsentRank(t *testing.T) {
	const world = 3
	pools := newPools(t, world, nil)
	_, hs := allocAll(t, pools, 64)
	// Run sequentially so no deadline depends on scheduling: rank 1's
	// signal is in rank 0's pad before rank 0's barrier starts, and rank
	// 0's is in rank 1's before rank 1's starts. Only rank 2 never comes.
	if err := hs[1].PutSignal(Now, 0, 2, 0); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < world-1; r++ {
		err := hs[r].Barrier(Now, 2, 100*time.Millisecond)
		var te *TimeoutError
		if !errors.As(err, &te) || te.Peer != 2 || te.Channel != 2 || te.Op != SignalBarrier || te.Rank != r {
			t.Errorf("rank %d: %v; want a barrier timeout naming rank 2 and channel 2", r, err)
		}
	}
}

// TestRecycledSignalPad leaves an unconsumed signal in rank 1's pad, frees
// the allocation and re-allocates it under the same persistent id: the
// address is the same, the pad is zero (the stale signal is gone) and a
// bounded barrier completes.
func TestRecycledSignalPad(t *testing.T) {
	pools := newPools(t, 2, nil)
	// alloc checks the pad before the rendezvous: right after it, a
	// peer's barrier may already have signalled into it.
	alloc := func(r int) (*Buffer, *Handle, error) {
		b, err := pools[r].AllocPersistent(4096, 1)
		if err != nil {
			return nil, nil, err
		}
		pad := unsafeBytes(b.addr+uintptr(b.padOff), 4*DefaultChannels*2)
		if !bytes.Equal(pad, make([]byte, len(pad))) {
			return nil, nil, fmt.Errorf("the signal pad at %#x is not zero", b.addr)
		}
		h, err := pools[r].Rendezvous(context.Background(), b)
		return b, h, err
	}
	addrs := make([]uintptr, 2)
	checkErrs(t, onRanks(2, func(r int) error {
		b, h, err := alloc(r)
		if err != nil {
			return err
		}
		addrs[r] = b.Addr()
		if err := h.Barrier(Now, 0, 0); err != nil {
			return err
		}
		if r == 0 {
			if err := h.PutSignal(Now, 1, 1, 0); err != nil {
				return err
			}
		}
		if err := h.Barrier(Now, 0, 0); err != nil {
			return err
		}
		if r == 1 && atomic.LoadUint32(word(h.word(1, 1, 0))) != 1 {
			return fmt.Errorf("rank 0's put on channel 1 is not in rank 1's pad")
		}
		return b.Free()
	}))
	if t.Failed() {
		return
	}
	checkErrs(t, onRanks(2, func(r int) error {
		b, h, err := alloc(r)
		if err != nil {
			return err
		}
		if b.Addr() != addrs[r] {
			return fmt.Errorf("persistent id moved from %#x to %#x", addrs[r], b.Addr())
		}
		if h.SignalPadPtrs()[r] != b.addr+uintptr(b.padOff) {
			return fmt.Errorf("own pad at %#x, want %#x", h.SignalPadPtrs()[r], b.addr+uintptr(b.padOff))
		}
		if r == 1 {
			// Rank 0 cannot have signalled on channel 1 yet: it waits in
			// the barrier on channel 0 below for this rank.
			if err := h.WaitSignal(Now, 0, 1, 20*time.Millisecond); !errors.Is(err, ErrTimeout) {
				return fmt.Errorf("the stale signal survived the re-allocation: %v", err)
			}
		}
		if err := h.Barrier(Now, 0, 10*time.Second); err != nil {
			return err
		}
		return h.Barrier(Now, 1, 10*time.Second)
	}))
}

func TestFreeAndCloseRelease(t *testing.T) {
	warm := newPools(t, 1, nil)[0]
	if _, err := warm.Alloc(1); err != nil {
		t.Fatal(err)
	}
	before := countResources(t)
	goroutines := runtime.NumGoroutine()
	st := rendezvous.NewMemStore()
	group := uniqueGroup(t)
	pools := make([]*Pool, 2)
	checkErrs(t, onRanks(2, func(r int) error {
		var err error
		pools[r], err = NewPool(context.Background(), Config{Group: group, Rank: r, WorldSize: 2, Store: st})
		return err
	}))
	if t.Failed() {
		return
	}
	var kept []*Buffer
	checkErrs(t, onRanks(2, func(r int) error {
		p := pools[r]
		for i := 0; i < 4; i++ {
			b, err := p.AllocPersistent(10000, uint64(i))
			if err != nil {
				return err
			}
			h, err := p.Rendezvous(context.Background(), b)
			if err != nil {
				return err
			}
			if err := h.Barrier(Now, 0, 0); err != nil {
				return err
			}
			if i%2 == 0 {
				if err := b.Free(); err != nil {
					return err
				}
				if err := h.Barrier(Now, 0, 0); !errors.Is(err, ErrFreed) {
					return fmt.Errorf("barrier on a freed handle: %v", err)
				}
			}
		}
		b, err := p.Alloc(3)
		if r == 0 {
			kept = append(kept, b)
		}
		return err
	}))
	if got := countResources(t); got.maps <= before.maps {
		t.Errorf("no memfd mappings while buffers are live (%d, %d before)", got.maps, before.maps)
	}
	for _, p := range pools {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if _, err := p.Alloc(1); !errors.Is(err, ErrClosed) {
			t.Errorf("Alloc after Close: %v", err)
		}
	}
	if _, _, ok := Lookup(kept[0].Addr()); ok {
		t.Error("Lookup finds a buffer of a closed pool")
	}
	if !eventually(func() bool { return countResources(t) == before }) {
		t.Errorf("after Close: %+v, before: %+v", countResources(t), before)
	}
	if !eventually(func() bool { return runtime.NumGoroutine() <= goroutines }) {
		t.Errorf("%d goroutines after Close, %d before", runtime.NumGoroutine(), goroutines)
	}
}

// TestConcurrentUse runs local allocation, Lookup and Free on several
// goroutines per rank while one goroutine per rank runs collective
// rendezvous and barriers (collectives must be issued in one order per
// rank). Run with -race.
func TestConcurrentUse(t *testing.T) {
	const world, workers, iters = 2, 3, 50
	pools := newPools(t, world, nil)
	checkErrs(t, onRanks(world, func(r int) error {
		p := pools[r]
		errs := onRanks(workers+1, func(w int) error {
			if w == workers {
				for i := 0; i < iters/5; i++ {
					b, err := p.Alloc(256)
					if err != nil {
						return err
					}
					h, err := p.Rendezvous(context.Background(), b)
					if err != nil {
						return err
					}
					if err := h.Barrier(Now, 0, 0); err != nil {
						return err
					}
					if err := b.Free(); err != nil {
						return err
					}
				}
				return nil
			}
			for i := 0; i < iters; i++ {
				b, err := p.Alloc(100 + w)
				if err != nil {
					return err
				}
				if got, off, ok := Lookup(b.Addr() + 99); !ok || got != b || off != 99 {
					return fmt.Errorf("Lookup of a live buffer: %p, %d, %v", got, off, ok)
				}
				b.Bytes()[99] = byte(i)
				if err := b.Free(); err != nil {
					return err
				}
			}
			return nil
		})
		return errors.Join(errs...)
	}))
}

func unsafeBytes(addr uintptr, n int) []byte { return unsafe.Slice((*byte)(ptrAt(addr)), n) }

// TestFreeWhilePeerMaps: rank 0 frees while rank 1 still maps its memory.
// Rank 1 keeps reading and writing it without fault (the memory lives on
// through rank 1's mapping), and once rank 1 frees too, nothing is held.
func TestFreeWhilePeerMaps(t *testing.T) {
	pools := newPools(t, 2, nil)
	before := countResources(t)
	bufs, hs := allocAll(t, pools, 4096)
	copy(bufs[0].Bytes(), "rank 0 was here")
	checkErrs(t, onRanks(2, func(r int) error { return hs[r].Barrier(Now, 0, 0) }))
	if err := bufs[0].Free(); err != nil {
		t.Fatal(err)
	}
	if hs[0].PeerBytes(1) != nil {
		t.Error("rank 0's handle still gives out rank 1's memory after Free")
	}
	peer := hs[1].PeerBytes(0)
	if got := string(peer[:15]); got != "rank 0 was here" {
		t.Errorf("rank 1 reads %q from rank 0's freed buffer", got)
	}
	copy(peer, "late write")
	if got := countResources(t); got.maps != before.maps+2 {
		t.Errorf("%d memfd mappings with rank 1's own chunk and its mapping of rank 0's, want %d", got.maps, before.maps+2)
	}
	if err := bufs[1].Free(); err != nil {
		t.Fatal(err)
	}
	if got := countResources(t); got != before {
		t.Errorf("after both Frees: %+v, before: %+v", got, before)
	}
}

// TestServerRefusals asks a pool's descriptor server for what it must not
// give: another pool instance's descriptor, a sequence it does not offer,
// and a malformed request. Each gets an error reply and no descriptor.
func TestServerRefusals(t *testing.T) {
	p := newPools(t, 1, nil)[0]
	for _, tc := range []struct {
		req  []byte
		want string
	}{
		{mustJSON(fdRequest{Nonce: "0123456789abcdef", Seq: 1, Rank: 3}), "another pool instance"},
		{mustJSON(fdRequest{Nonce: p.nonce, Seq: 99, Rank: 3}), "nothing under sequence 99 to rank 3"},
		{[]byte("{"), "bad request"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := fdpass.Dial(ctx, p.socks[0])
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Send(tc.req); err != nil {
			t.Fatal(err)
		}
		b, files, err := c.Recv(1)
		c.Close()
		var rep fdReply
		if err != nil || json.Unmarshal(b, &rep) != nil || len(files) != 0 || !strings.Contains(rep.Err, tc.want) {
			t.Errorf("request %s: reply %q, %d descriptors, %v; want an error with %q", tc.req, b, len(files), err, tc.want)
		}
		for _, f := range files {
			f.Close()
		}
	}
}

// formAndMeet forms group on every rank of st and rendezvouses one buffer:
// a pool that formed with a stale peer fails here.
func formAndMeet(st rendezvous.Store, group string, world int, timeout time.Duration) []error {
	return onRanks(world, func(r int) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		p, err := NewPool(ctx, Config{Group: group, Rank: r, WorldSize: world, Store: st})
		if err != nil {
			return err
		}
		defer p.Close()
		b, err := p.Alloc(4096)
		if err != nil {
			return err
		}
		_, err = p.Rendezvous(ctx, b)
		return err
	})
}

// TestNewPoolRetryAfterTimeout: rank 1 forms alone and times out; then
// every rank calls NewPool again on the same store and group: the pool
// forms and works. (Before, rank 1's timed-out entry stayed at its
// generation, rank 0 formed from it, a pool with a closed socket, and rank
// 1 waited for an entry rank 0 would never write.)
func TestNewPoolRetryAfterTimeout(t *testing.T) {
	st := rendezvous.NewMemStore()
	group := uniqueGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := NewPool(ctx, Config{Group: group, Rank: 1, WorldSize: 2, Store: st})
	cancel()
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("rank 1 alone: %v; want a timeout", err)
	}
	for attempt := range 2 {
		for r, err := range formAndMeet(st, group, 2, 5*time.Second) {
			if err != nil {
				t.Errorf("attempt %d, rank %d: %v", attempt, r, err)
			}
		}
	}
}

// TestNewPoolStaleEntry: rank 0 reads an entry of rank 1 left by an earlier
// NewPool (as when rank 1 gave up at the moment rank 0 read it), then rank
// 1 forms afresh: both fail with ErrMismatch saying so, instead of rank 0
// holding a pool whose peer is gone; called again, both form.
func TestNewPoolStaleEntry(t *testing.T) {
	st := rendezvous.NewMemStore()
	group := uniqueGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stale := poolInfo{World: 2, Channels: DefaultChannels, Backend: "host", Sock: "@collgen-symm-gone", Nonce: "stale"}
	if err := st.Set(ctx, "collgen/symm/"+group+"/pool/1/r1", mustJSON(stale)); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p, err := NewPool(ctx, Config{Group: group, Rank: 0, WorldSize: 2, Store: st, Timeout: 5 * time.Second})
		if err == nil {
			p.Close()
		}
		errs[0] = err
	}()
	// Rank 1 comes once rank 0 has read the stale entry and waits in the
	// second round.
	if err := st.Wait(ctx, "collgen/symm/"+group+"/pool/1/r0"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	p, err := NewPool(ctx, Config{Group: group, Rank: 1, WorldSize: 2, Store: st, Timeout: 5 * time.Second})
	if err == nil {
		p.Close()
	}
	errs[1] = err
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "earlier NewPool") {
			t.Errorf("rank %d: %v; want ErrMismatch naming an earlier NewPool's entry", r, err)
		}
	}
	for r, err := range formAndMeet(st, group, 2, 5*time.Second) {
		if err != nil {
			t.Errorf("again, rank %d: %v", r, err)
		}
	}
}

// TestRefusalsAreTyped: every refusal of an argument wraps
// ErrInvalidArgument, and nothing is left open.
func TestRefusalsAreTyped(t *testing.T) {
	st := rendezvous.NewMemStore()
	ctx := context.Background()
	for _, cfg := range []Config{
		{Group: "g", Rank: 0, WorldSize: 1},
		{Rank: 0, WorldSize: 1, Store: st},
		{Group: "g", Rank: 0, WorldSize: 0, Store: st},
		{Group: "g", Rank: 0, WorldSize: 1 << 62, Store: st},
		{Group: "g", Rank: 0, WorldSize: MaxWorldSize + 1, Store: st},
		{Group: "g", Rank: 2, WorldSize: 2, Store: st},
		{Group: "g", Rank: 0, WorldSize: 1, Channels: -1, Store: st},
		{Group: "g", Rank: 0, WorldSize: 1, Timeout: -time.Second, Store: st},
	} {
		if _, err := NewPool(ctx, cfg); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("NewPool(%+v): %v; want ErrInvalidArgument", cfg, err)
		}
	}
	p := newPools(t, 1, nil)[0]
	for _, n := range []int{0, -1, MaxAllocBytes + 1, 1 << 62} {
		if _, err := p.Alloc(n); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Alloc(%d): %v; want ErrInvalidArgument", n, err)
		}
	}
	b, err := p.AllocPersistent(4096, 7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.AllocPersistent(4096, 7); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("AllocPersistent of a live id: %v; want ErrInvalidArgument", err)
	}
	h, err := p.Rendezvous(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"peer 1", h.PutSignal(Now, 1, 0, 0)},
		{"peer -1", h.WaitSignal(Now, -1, 0, 0)},
		{"channel 64", h.Barrier(Now, DefaultChannels, 0)},
		{"negative timeout", h.WaitSignal(Now, 0, 0, -time.Hour)},
		{"negative barrier timeout", h.Barrier(Now, 0, -time.Nanosecond)},
	} {
		if !errors.Is(c.err, ErrInvalidArgument) {
			t.Errorf("%s: %v; want ErrInvalidArgument", c.name, c.err)
		}
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AllocPersistent(8192, 7); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("AllocPersistent with another size: %v; want ErrInvalidArgument", err)
	}
}

// waitingRendezvous starts rank 0's Rendezvous of a pool of world 2 whose
// rank 1 never calls, and returns rank 0's pool, buffer and the call's
// result channel once the call is waiting for rank 1.
func waitingRendezvous(t *testing.T) (*Pool, *Buffer, chan error) {
	t.Helper()
	pools := newPools(t, 2, func(r int, c *Config) { c.Timeout = 10 * time.Second })
	b, err := pools[0].Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := pools[0].Rendezvous(context.Background(), b)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // into the wait for rank 1's entry
	return pools[0], b, done
}

// within fails t unless fn returns within d, and returns how long it took.
func within(t *testing.T, what string, d time.Duration, fn func()) {
	t.Helper()
	start := time.Now()
	fn()
	if took := time.Since(start); took > d {
		t.Errorf("%s took %v while a Rendezvous waited for a peer; want under %v", what, took, d)
	}
}

// TestRendezvousWaitHoldsNothing: while a Rendezvous waits for a peer that
// never comes, Bytes returns at once; Free returns at once and ends the
// Rendezvous with ErrFreed; Close does the same with ErrClosed. (Before,
// each waited for the Rendezvous's whole timeout: it held the buffer's
// lock across the collective.)
func TestRendezvousWaitHoldsNothing(t *testing.T) {
	t.Run("Bytes", func(t *testing.T) {
		p, b, done := waitingRendezvous(t)
		within(t, "Bytes", time.Second, func() {
			if len(b.Bytes()) != 4096 {
				t.Error("Bytes: wrong length")
			}
		})
		within(t, "Close", time.Second, func() { p.Close() })
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("Rendezvous: %v; want ErrClosed", err)
		}
	})
	t.Run("Free", func(t *testing.T) {
		p, b, done := waitingRendezvous(t)
		within(t, "Free", time.Second, func() {
			if err := b.Free(); err != nil {
				t.Errorf("Free: %v", err)
			}
		})
		select {
		case err := <-done:
			if !errors.Is(err, ErrFreed) || errors.Is(err, ErrClosed) {
				t.Errorf("Rendezvous: %v; want ErrFreed", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("the Rendezvous did not end after Free")
		}
		// The pool is broken now: ranks parted at different steps.
		b2, err := p.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Rendezvous(context.Background(), b2); !errors.Is(err, ErrBroken) || !strings.Contains(err.Error(), "freed") {
			t.Errorf("a later Rendezvous: %v; want ErrBroken naming the first failure", err)
		}
	})
	t.Run("Close", func(t *testing.T) {
		p, b, done := waitingRendezvous(t)
		within(t, "Close", time.Second, func() {
			if err := p.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("Rendezvous: %v; want ErrClosed", err)
		}
		if err := b.Free(); !errors.Is(err, ErrClosed) || !errors.Is(err, ErrFreed) {
			t.Errorf("Free after Close: %v; want ErrClosed and ErrFreed", err)
		}
		if _, err := p.Rendezvous(context.Background(), b); !errors.Is(err, ErrClosed) {
			t.Errorf("Rendezvous after Close: %v; want ErrClosed", err)
		}
	})
}

// TestRendezvousTimeoutBreaksPool: a Rendezvous whose peer does not come in
// time breaks the pool (every later one fails at once with ErrBroken), while
// a size disagreement leaves it usable.
func TestRendezvousTimeoutBreaksPool(t *testing.T) {
	pools := newPools(t, 2, nil)
	sizes := []int{4096, 8192}
	errs := onRanks(2, func(r int) error {
		b, err := pools[r].Alloc(sizes[r])
		if err != nil {
			return err
		}
		_, err = pools[r].Rendezvous(context.Background(), b)
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) {
			t.Fatalf("rank %d: %v; want ErrMismatch", r, err)
		}
	}
	errs = onRanks(2, func(r int) error {
		b, err := pools[r].Alloc(4096)
		if err != nil {
			return err
		}
		_, err = pools[r].Rendezvous(context.Background(), b)
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("after the mismatch, rank %d: %v; want the pool usable", r, err)
		}
	}
	b, err := pools[0].Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := pools[0].Rendezvous(ctx, b); !errors.Is(err, ErrTimeout) {
		t.Fatalf("rank 0 alone: %v; want a timeout", err)
	}
	start := time.Now()
	if _, err := pools[0].Rendezvous(context.Background(), b); !errors.Is(err, ErrBroken) || !strings.Contains(err.Error(), "missing rank 1") {
		t.Errorf("again: %v; want ErrBroken naming the timeout", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the broken pool's Rendezvous took %v; want it at once", d)
	}
}

// TestAllocBeyondMemory: the host twin refuses an allocation larger than
// what the process has left with ErrNoMemory, before taking any (a memfd
// has no size limit of its own: fallocate of it woke the OOM killer, which
// killed the process instead of failing the call).
func TestAllocBeyondMemory(t *testing.T) {
	avail, ok := meminfo.Available()
	if !ok {
		t.Skip("no MemAvailable or memory cgroup to read")
	}
	p := newPools(t, 1, nil)[0]
	n := int(min(avail+1<<30, MaxAllocBytes))
	b, err := p.Alloc(n)
	if err == nil {
		b.Free()
		t.Fatalf("Alloc(%d) with %d bytes available succeeded", n, avail)
	}
	if !errors.Is(err, ErrNoMemory) || !strings.Contains(err.Error(), "left to this process") {
		t.Fatalf("Alloc(%d): %v; want ErrNoMemory", n, err)
	}
	// Nothing is left behind: the pool allocates as before.
	b, err = p.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b.Free()
}

// arrays is gpuLike with device pointer arrays (DeviceArrayMaker) in host
// memory, counting the live ones.
type arrays struct {
	*gpuLike
	live atomic.Int32
	keep sync.Map // address -> the slice, kept alive
}

func (a *arrays) DeviceArray(ptrs []uintptr) (uintptr, func() error, error) {
	buf := append([]uintptr(nil), ptrs...)
	addr := uintptr(unsafe.Pointer(&buf[0]))
	a.keep.Store(addr, buf)
	a.live.Add(1)
	return addr, func() error { a.keep.Delete(addr); a.live.Add(-1); return nil }, nil
}

// TestPersistentPeersStay: three rounds of AllocPersistent, Rendezvous,
// writes through the first round's peer pointers, Free, on three ranks:
// every rank's BufferPtrs and SignalPadPtrs, and its device arrays, are
// the first round's in every round, and a write through a pointer saved in
// round 0 lands in that peer's new memory, as a kernel captured in a CUDA
// graph would write. (Before, peers were mapped at fresh addresses each
// round, and the arrays made anew.) Rank 2 uses plain Alloc: its peers'
// view of it stays put all the same (its own view of them moves). The
// arrays go at Close.
func TestPersistentPeersStay(t *testing.T) {
	const world, n = 3, 4096
	for _, devArrays := range []bool{false, true} {
		t.Run(fmt.Sprintf("deviceArrays=%v", devArrays), func(t *testing.T) {
			bes := make([]*arrays, world)
			t.Cleanup(func() { // after the pools' Close (cleanups run last first)
				for r, be := range bes {
					if be != nil && be.live.Load() != 0 {
						t.Errorf("rank %d: %d device arrays live after Close", r, be.live.Load())
					}
				}
			})
			pools := newPools(t, world, func(r int, c *Config) {
				if devArrays {
					bes[r] = &arrays{gpuLike: &gpuLike{Backend: NewHostBackend()}}
					c.Backend = bes[r]
				}
			})
			first := make([][]uintptr, world)
			firstDev := make([]uintptr, world)
			for round := range 3 {
				checkErrs(t, onRanks(world, func(r int) error {
					ord := Ordering(Now)
					if devArrays {
						ord = stream{r}
					}
					var b *Buffer
					var err error
					if r == 2 {
						b, err = pools[r].Alloc(n)
					} else {
						b, err = pools[r].AllocPersistent(n, 42)
					}
					if err != nil {
						return err
					}
					h, err := pools[r].Rendezvous(context.Background(), b)
					if err != nil {
						return err
					}
					ptrs := append(h.BufferPtrs(), h.SignalPadPtrs()...)
					if devArrays {
						if dev := unsafe.Slice((*uintptr)(ptrAt(h.BufferPtrsDev())), world); !slices.Equal(dev, h.BufferPtrs()) {
							return fmt.Errorf("round %d: device array %x, BufferPtrs %x", round, dev, h.BufferPtrs())
						}
					}
					if round == 0 {
						first[r], firstDev[r] = ptrs, h.BufferPtrsDev()
					} else if r != 2 && (!slices.Equal(ptrs, first[r]) || h.BufferPtrsDev() != firstDev[r]) {
						return fmt.Errorf("round %d: pointers %x, device array %#x; round 0 had %x, %#x", round, ptrs, h.BufferPtrsDev(), first[r], firstDev[r])
					}
					// Through round 0's pointer to the next rank's buffer
					// (rank 2, not persistent, through this round's).
					next := (r + 1) % world
					to := first[r][next]
					if r == 2 {
						to = h.Peer(next)
					}
					msg := fmt.Sprintf("round %d from rank %d", round, r)
					copy(unsafeBytes(to, len(msg)), msg)
					if err := h.Barrier(ord, 0, 0); err != nil {
						return err
					}
					prev := (r + world - 1) % world
					want := fmt.Sprintf("round %d from rank %d", round, prev)
					if got := string(unsafeBytes(b.Addr(), len(want))); got != want {
						return fmt.Errorf("round %d: my buffer holds %q, want %q", round, got, want)
					}
					if err := h.Barrier(ord, 1, 0); err != nil {
						return err
					}
					return b.Free()
				}))
			}
		})
	}
}

// failOnce is a host backend whose first Import fails.
type failOnce struct {
	Backend
	failed atomic.Bool
}

func (f *failOnce) Import(file *os.File, size int, at uintptr) (Mapping, error) {
	if f.failed.CompareAndSwap(false, true) {
		return nil, errors.New("import refused (test)")
	}
	return f.Backend.Import(file, size, at)
}

// TestRendezvousMappingFailureKeepsPool: a rank that cannot map a peer
// fails every rank with its reason, and, as every rank saw the same
// reports, the pool is not broken: the next Rendezvous works.
func TestRendezvousMappingFailureKeepsPool(t *testing.T) {
	pools := newPools(t, 2, func(r int, c *Config) {
		if r == 1 {
			c.Backend = &failOnce{Backend: NewHostBackend()}
		}
	})
	rdv := func() []error {
		return onRanks(2, func(r int) error {
			b, err := pools[r].Alloc(4096)
			if err != nil {
				return err
			}
			_, err = pools[r].Rendezvous(context.Background(), b)
			return err
		})
	}
	for r, err := range rdv() {
		if err == nil || !strings.Contains(err.Error(), "import refused") || errors.Is(err, ErrBroken) {
			t.Errorf("rank %d: %v; want rank 1's import failure", r, err)
		}
	}
	for r, err := range rdv() {
		if err != nil {
			t.Errorf("rank %d, next Rendezvous: %v; want the pool usable", r, err)
		}
	}
}

// closedGroup forms world pools on one KeyStore, allocates and frees a
// buffer on every rank rounds times and closes the pools. It returns them,
// the store and what a forget leaves of the group (the store-wide notes,
// one per rank number), failing t unless more than that is live.
func closedGroup(t *testing.T, world, rounds int) ([]*Pool, *storetest.KeyStore, []string) {
	t.Helper()
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	pools := newPools(t, world, func(_ int, c *Config) { c.Store = st })
	for range rounds {
		bufs, _ := allocAll(t, pools, 4096)
		for _, b := range bufs {
			if err := b.Free(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range pools {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for r := range world {
		want = append(want, seenKey(r))
	}
	if before := st.Live(); len(before) <= len(want) {
		t.Fatalf("only %q live before the forget: the test does not exercise it", before)
	}
	return pools, st, want
}

// Forget leaves, of a group formed, used and closed, only the store-wide
// notes of the group each rank number last formed: the forming rounds'
// and every Rendezvous's entries and counters go (a long-lived store
// gained about four keys per rank per pool, and two per Rendezvous).
func TestPoolForget(t *testing.T) {
	const world = 3
	pools, st, want := closedGroup(t, world, 3)
	if err := pools[world-1].Forget(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := st.Live(); !slices.Equal(left, want) {
		t.Fatalf("after Forget: %q, want only %q", left, want)
	}
	// A second Forget finds nothing and is not an error.
	if err := pools[0].Forget(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// ForgetGroup, from the store alone (a rank without the pool: its
// NewPool failed, or it never called it), leaves what Forget leaves: of a
// group formed, used and closed, and of one whose forming failed (ranks 0
// and 1 waited for a rank 2 that never came, and withdrew: their
// generation counters stayed at 0), only the store-wide notes.
func TestForgetGroup(t *testing.T) {
	ctx := context.Background()
	pools, st, want := closedGroup(t, 3, 2)
	if err := ForgetGroup(ctx, st, pools[0].Group(), 3); err != nil {
		t.Fatal(err)
	}
	if left := st.Live(); !slices.Equal(left, want) {
		t.Fatalf("after ForgetGroup: %q, want only %q", left, want)
	}

	errs := onRanks(2, func(r int) error {
		_, err := NewPool(ctx, Config{Group: "failed", Rank: r, WorldSize: 3, Store: st, Timeout: 200 * time.Millisecond})
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("rank %d: NewPool without rank 2: %v, want ErrTimeout", r, err)
		}
	}
	if left := st.Live(); len(left) <= len(want) {
		t.Fatalf("the failed forming left %q: the test did not exercise it", left)
	}
	if err := ForgetGroup(ctx, st, "failed", 3); err != nil {
		t.Fatal(err)
	}
	if left := st.Live(); !slices.Equal(left, want) {
		t.Fatalf("after ForgetGroup of the failed forming: %q, want only %q", left, want)
	}
	for _, bad := range []func() error{
		func() error { return ForgetGroup(ctx, nil, "g", 2) },
		func() error { return ForgetGroup(ctx, st, "", 2) },
		func() error { return ForgetGroup(ctx, st, "g", 0) },
	} {
		if err := bad(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%v; want ErrInvalidArgument", err)
		}
	}
}

// silentPeer forms a pool of world 2 whose rank 1's descriptor server is
// replaced by a socket that takes connections and never answers (a peer
// process stopped, SIGSTOP or a debugger, after it published its
// Rendezvous entry), and starts both ranks' Rendezvous. It returns rank
// 0's pool, buffer and the result of its Rendezvous once that call waits
// for rank 1's descriptor.
func silentPeer(t *testing.T, ctx context.Context) (*Pool, *Buffer, chan error) {
	t.Helper()
	pools := newPools(t, 2, func(r int, c *Config) { c.Timeout = 20 * time.Second })
	addr := pools[1].srv.Addr()
	pools[1].srv.Close()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var bufs [2]*Buffer
	for r := range bufs {
		if bufs[r], err = pools[r].Alloc(4096); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := pools[0].Rendezvous(ctx, bufs[0])
		done <- err
	}()
	go pools[1].Rendezvous(context.Background(), bufs[1])
	time.Sleep(500 * time.Millisecond) // rank 0 asked rank 1's socket, which never answers
	select {
	case err := <-done:
		t.Fatalf("rank 0's Rendezvous ended before the silent peer was asked: %v", err)
	default:
	}
	return pools[0], bufs[0], done
}

// TestRendezvousSilentPeerEndsAtOnce: a Rendezvous waiting for a peer's
// descriptor that never comes ends at once when its ctx is cancelled, or
// the buffer freed, or the pool closed, as it does while it waits for a
// peer's entry. (Before, the descriptor request was bounded only by the
// deadline: Free, Close and a cancelled ctx all waited for it, 20 s here,
// 5 min by default.)
func TestRendezvousSilentPeerEndsAtOnce(t *testing.T) {
	end := func(t *testing.T, done chan error, want error) {
		t.Helper()
		select {
		case err := <-done:
			if !errors.Is(err, want) {
				t.Errorf("Rendezvous: %v; want %v", err, want)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("the Rendezvous did not end")
		}
	}
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		_, _, done := silentPeer(t, ctx)
		cancel()
		end(t, done, context.Canceled)
	})
	t.Run("Free", func(t *testing.T) {
		_, b, done := silentPeer(t, context.Background())
		within(t, "Free", time.Second, func() { b.Free() })
		end(t, done, ErrFreed)
	})
	t.Run("Close", func(t *testing.T) {
		p, _, done := silentPeer(t, context.Background())
		within(t, "Close", 3*time.Second, func() { p.Close() })
		end(t, done, ErrClosed)
	})
}

// TestAllocBeyondAddressSpace: an allocation within MaxAllocBytes that
// needs more address space than the process has (256 TiB, or 128 TiB,
// past x86-64's 47-bit user space) is refused with ErrNoMemory, like one
// beyond memory, and the pool allocates as before. (Before, it failed
// with a bare "cannot allocate memory" matching no sentinel.)
func TestAllocBeyondAddressSpace(t *testing.T) {
	p := newPools(t, 1, nil)[0]
	for _, n := range []int{MaxAllocBytes, 1 << 47} {
		b, err := p.Alloc(n)
		if err == nil {
			b.Free()
			t.Fatalf("Alloc(%d) succeeded", n)
		}
		if !errors.Is(err, ErrNoMemory) {
			t.Errorf("Alloc(%d): %v; want ErrNoMemory", n, err)
		}
	}
	b, err := p.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b.Free()
}
