//go:build linux && (amd64 || arm64)

package comm

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/symm"
)

// The fake device accepts every pool (its memory is made up anyway).
func (d worldDevice) checkSymmetric(*symm.Pool) error { return nil }
func (d worldDevice) addSymmetric(*symm.Pool)         {}

// hostPools forms a world-rank group of host-twin pools.
func hostPools(t *testing.T, group string, world int) []*symm.Pool {
	t.Helper()
	st := rendezvous.NewMemStore()
	pools := make([]*symm.Pool, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			pools[r], errs[r] = symm.NewPool(context.Background(), symm.Config{Group: group, Rank: r, WorldSize: world, Store: st})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range pools {
			p.Close()
		}
	})
	return pools
}

// TestUseSymmetric checks UseSymmetric's agreement: one pool instance on
// every rank is accepted; pools of two instances, a pool whose rank differs
// from the communicator's, and a nil pool are refused on every rank with
// the rank and the reason.
func TestUseSymmetric(t *testing.T) {
	comms, _ := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	a, b := hostPools(t, "a", 2), hostPools(t, "b", 2)
	ctx := context.Background()

	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error { return c.UseSymmetric(ctx, a[r]) })...); err != nil {
		t.Fatalf("one pool instance: %v", err)
	}
	mixed := []*symm.Pool{a[0], b[1]}
	for r, err := range onRanks(comms, func(r int, c *Communicator) error { return c.UseSymmetric(ctx, mixed[r]) }) {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "passed pool instance") {
			t.Errorf("rank %d, pools of two instances: %v, want ErrMismatch naming the instances", r, err)
		}
	}
	swapped := []*symm.Pool{a[1], a[0]}
	for r, err := range onRanks(comms, func(r int, c *Communicator) error { return c.UseSymmetric(ctx, swapped[r]) }) {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "is rank") {
			t.Errorf("rank %d, pool ranks swapped: %v, want ErrMismatch naming the ranks", r, err)
		}
	}
	if err := comms[0].UseSymmetric(ctx, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil pool: %v, want ErrInvalidArgument", err)
	}
}
