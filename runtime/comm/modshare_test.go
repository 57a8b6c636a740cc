package comm

import (
	"context"
	"errors"
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
