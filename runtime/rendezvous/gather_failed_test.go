package rendezvous_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// Case 74's rule for the collectives' own keys: an AllGather or Barrier
// that failed (its wait timed out, its ctx was cancelled) while a peer was
// away kept this rank's entry of that generation, and ForgetAllGather /
// ForgetBarrier deleted only each rank's last two generations, so the
// entries of earlier failed calls stayed on the store after the group was
// forgotten (comm: UseSymmetric timing out three times left .../usesymm/1/0).
func TestFailedGatherLeavesNoKeysAfterForget(t *testing.T) {
	const world = 2
	fail := func(t *testing.T, call func(ctx context.Context) error, cancelled bool) {
		t.Helper()
		var ctx context.Context
		var cancel context.CancelFunc
		if cancelled {
			ctx, cancel = context.WithCancel(context.Background())
			time.AfterFunc(20*time.Millisecond, cancel)
		} else {
			ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
		}
		defer cancel()
		if err := call(ctx); err == nil {
			t.Fatal("call with the peer away succeeded")
		}
	}
	for _, cancelled := range []bool{false, true} {
		t.Run(fmt.Sprintf("peer away, cancelled=%v", cancelled), func(t *testing.T) {
			st := storetest.NewKeyStore(rendezvous.NewMemStore())
			for range 3 {
				fail(t, func(ctx context.Context) error {
					_, err := rendezvous.AllGather(ctx, st, "ag", 0, world, []byte("x"))
					return err
				}, cancelled)
				fail(t, func(ctx context.Context) error { return rendezvous.Barrier(ctx, st, "b", 0, world) }, cancelled)
			}
			forgetAll(t, st, world)
		})
	}

	// Rank 0 and 1 meet (generation 1), rank 0 fails twice alone (2, 3),
	// rank 1 comes late and its calls 2 and 3 meet rank 0's entries (as
	// documented: the n-th call meets the n-th call), then both meet twice
	// more (4, 5). Only generation 5 may be left before Forget, nothing
	// after it.
	t.Run("failures between successes", func(t *testing.T) {
		st := storetest.NewKeyStore(rendezvous.NewMemStore())
		both := func(round int) {
			t.Helper()
			errs := make([]error, world)
			var wg sync.WaitGroup
			for r := range world {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					got, err := rendezvous.AllGather(ctx, st, "ag", r, world, []byte{byte(r), byte(round)})
					if err == nil && (string(got[0]) != string([]byte{0, byte(round)}) || string(got[1]) != string([]byte{1, byte(round)})) {
						err = fmt.Errorf("round %d: got %v", round, got)
					}
					if err == nil {
						err = rendezvous.Barrier(ctx, st, "b", r, world)
					}
					errs[r] = err
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		}
		both(1)
		for round := 2; round <= 3; round++ {
			fail(t, func(ctx context.Context) error {
				_, err := rendezvous.AllGather(ctx, st, "ag", 0, world, []byte{0, byte(round)})
				return err
			}, false)
			fail(t, func(ctx context.Context) error { return rendezvous.Barrier(ctx, st, "b", 0, world) }, false)
		}
		// Rank 1's late calls meet rank 0's failed ones at once.
		for round := 2; round <= 3; round++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			got, err := rendezvous.AllGather(ctx, st, "ag", 1, world, []byte{1, byte(round)})
			if err == nil && string(got[0]) != string([]byte{0, byte(round)}) {
				err = fmt.Errorf("late call %d met rank 0's %v", round, got[0])
			}
			if err == nil {
				err = rendezvous.Barrier(ctx, st, "b", 1, world)
			}
			cancel()
			if err != nil {
				t.Fatalf("rank 1's late call %d: %v", round, err)
			}
		}
		both(4)
		both(5)
		var old []string
		for _, k := range st.Live() {
			switch k {
			case "collgen/allgather/ag/5/0", "collgen/allgather/ag/5/1", "collgen/barrier/b/5/0", "collgen/barrier/b/5/1",
				"collgen/allgather/ag/gen/0", "collgen/allgather/ag/gen/1", "collgen/barrier/b/gen/0", "collgen/barrier/b/gen/1":
			default:
				old = append(old, k)
			}
		}
		if len(old) > 0 {
			t.Errorf("after generation 5 completed, earlier generations' keys are still live: %q", old)
		}
		forgetAll(t, st, world)
	})
}

// forgetAll forgets the test's two names and checks nothing is left.
func forgetAll(t *testing.T, st *storetest.KeyStore, world int) {
	t.Helper()
	ctx := context.Background()
	if err := rendezvous.ForgetAllGather(ctx, st, "ag", world); err != nil {
		t.Fatal(err)
	}
	if err := rendezvous.ForgetBarrier(ctx, st, "b", world); err != nil {
		t.Fatal(err)
	}
	if left := st.Live(); len(left) > 0 {
		t.Errorf("keys left after ForgetAllGather and ForgetBarrier: %q", left)
	}
}
