package comm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

// TestModuleShare: the first claimant of a module loads it, later ones
// wait for it and take it (on its GPU only), and the last drop hands it
// back for unloading; a failed load reaches its waiters and the next
// claim loads again; a waiter whose context ends gives its reference
// back.
func TestModuleShare(t *testing.T) {
	s := newModuleShare[string]()
	k0, k1 := moduleKey{0, "fatbin a"}, moduleKey{1, "fatbin a"}
	e, mine := s.claim(k0)
	if !mine {
		t.Fatal("the first claim is not the loader")
	}
	e2, mine2 := s.claim(k0)
	if mine2 || e2 != e {
		t.Fatal("a second claim on the same GPU loads again")
	}
	if _, mine := s.claim(k1); !mine {
		t.Fatal("another GPU's claim took GPU 0's module")
	}
	got := make(chan string, 1)
	go func() {
		m, err := s.wait(context.Background(), k0, e2)
		if err != nil {
			m = err.Error()
		}
		got <- m
	}()
	select {
	case m := <-got:
		t.Fatalf("wait returned %q before the load", m)
	case <-time.After(10 * time.Millisecond):
	}
	s.fill(k0, e, "module", nil)
	if m := <-got; m != "module" {
		t.Fatalf("waiter got %q", m)
	}
	if _, last := s.drop(k0); last {
		t.Fatal("the first of two drops was the last")
	}
	if m, last := s.drop(k0); !last || m != "module" {
		t.Fatalf("the last drop: %q, %v", m, last)
	}
	if _, mine := s.claim(k0); !mine {
		t.Fatal("after the last drop a claim does not load again")
	}

	// A failed load: its waiter gets the error, the next claim loads.
	k2 := moduleKey{2, "nvrtc x"}
	e, _ = s.claim(k2)
	e2, _ = s.claim(k2)
	boom := errors.New("bad image")
	s.fill(k2, e, "", boom)
	if _, err := s.wait(context.Background(), k2, e2); !errors.Is(err, boom) {
		t.Fatalf("waiter of a failed load: %v", err)
	}
	if _, mine := s.claim(k2); !mine {
		t.Fatal("after a failed load a claim does not load again")
	}

	// A waiter whose context ends drops its reference: the loader's drop
	// is then the last.
	k3 := moduleKey{3, "fatbin b"}
	e, _ = s.claim(k3)
	e2, _ = s.claim(k3)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.wait(ctx, k3, e2); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	s.fill(k3, e, "m3", nil)
	if m, last := s.drop(k3); !last || m != "m3" {
		t.Fatalf("the loader's drop after a cancelled waiter: %q, %v", m, last)
	}
}

// TestModuleShareRandom: goroutines claim, load or wait for, use and drop
// modules of three keys at random, some loads failing. A module a holder
// gets is never one already unloaded, a key is loaded only while no one
// holds it (holders of a key share one module), every loaded module is
// unloaded exactly once, and the share is empty at the end.
func TestModuleShareRandom(t *testing.T) {
	type mod struct {
		key      int
		unloaded atomic.Bool
	}
	s := newModuleShare[*mod]()
	var holders [3]atomic.Int32 // holders of each key's module, between getting and dropping it
	var loads, unloads atomic.Int32
	var bad atomic.Value
	randomWorkers(8, 400, 11, func(rng *rand.Rand) {
		k := rng.IntN(3)
		key := moduleKey{0, fmt.Sprint("m", k)}
		e, mine := s.claim(key)
		var m *mod
		var err error
		if mine {
			if rng.IntN(8) == 0 {
				err = errors.New("load failed")
			} else {
				m = &mod{key: k}
				loads.Add(1)
				if n := holders[k].Load(); n != 0 {
					bad.Store(fmt.Sprintf("key %d loaded again while %d hold it", k, n))
				}
			}
			s.fill(key, e, m, err)
		} else {
			m, err = s.wait(context.Background(), key, e)
		}
		if err != nil {
			return // no reference left to drop
		}
		holders[k].Add(1)
		if m.unloaded.Load() {
			bad.Store(fmt.Sprintf("a holder of key %d got an unloaded module", k))
		}
		time.Sleep(time.Duration(rng.IntN(10)) * time.Microsecond)
		holders[k].Add(-1)
		if got, last := s.drop(key); last {
			if got != m || got.unloaded.Swap(true) {
				bad.Store(fmt.Sprintf("key %d: the last drop returned another or an unloaded module", k))
			}
			unloads.Add(1)
		}
	})
	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	if loads.Load() != unloads.Load() || loads.Load() == 0 || len(s.m) != 0 {
		t.Errorf("%d loads, %d unloads, %d entries left", loads.Load(), unloads.Load(), len(s.m))
	}
}

// TestModuleShareWaitAfterFailedLoad: a waiter whose context ends once
// its loader's load failed (the entry is gone) and another claimant has
// begun loading the module again gives back no reference of that
// claimant's entry. It did (drop by key): the new entry's last reference
// went, so its loader's module would be unloaded under its holder.
func TestModuleShareWaitAfterFailedLoad(t *testing.T) {
	k := moduleKey{0, "nvrtc lib prog"}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 64 { // wait's select picks at random when both are ready
		s := newModuleShare[string]()
		e1, _ := s.claim(k)
		w1, _ := s.claim(k) // a waiter of the first load
		s.fill(k, e1, "", errors.New("load failed"))
		e2, mine := s.claim(k) // a new claimant loads again
		if !mine || e2 == e1 {
			t.Fatal("a claim after a failed load did not load again")
		}
		if _, err := s.wait(cancelled, k, w1); err == nil {
			t.Fatalf("round %d: wait returned no error for a failed load", i)
		}
		s.fill(k, e2, "module", nil)
		if e2.refs != 1 || s.m[k] != e2 {
			t.Fatalf("round %d: the new loader's entry has %d references (want 1), in the share: %v", i, e2.refs, s.m[k] == e2)
		}
		if m, last := s.drop(k); !last || m != "module" {
			t.Fatalf("round %d: the new loader's drop is not the last (%q, %v)", i, m, last)
		}
	}
}
