package gpubench

import (
	"context"
	"strings"
	"testing"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestStagingCoversLargestShape: the staging a plan sizes for its
// forced push algorithms without rounds must hold the inbox of the sweep's
// largest shape, not of its last one. With awkward twins the last shape is
// the largest size's twin, one element less per rank: at world 3 its
// one-shot LL inbox is a line short of the regular size's, so `collgen
// bench --backend gpu -n 3 --collective reduce_scatter --awkward` skipped
// forced oneshot_ll at 256MiB ("above its staging buffer"). Config.Sizes in
// another order than ascending (the API does not ask for one) did the
// same.
func TestStagingCoversLargestShape(t *testing.T) {
	lib := collectives.Library
	for _, c := range []struct {
		name  string
		coll  coll.Collective
		world int
		sizes []int64
		aw    bench.AwkwardKind
	}{
		{"rs-w3-awkward-both", coll.ReduceScatter, 3, []int64{1 << 10, 256 << 20}, bench.AwkwardBoth},
		{"ag-w3-awkward-count", coll.AllGather, 3, []int64{1 << 10, 256 << 20}, bench.AwkwardCount},
	} {
		op := coll.Sum
		if c.coll == coll.AllGather {
			op = ""
		}
		p, err := NewPlan(Config{Library: lib, WorldSize: c.world, Collective: c.coll, DType: coll.F32, Op: op,
			Sizes: c.sizes, Algorithms: []string{"oneshot_ll"}, Awkward: c.aw})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for _, sh := range p.Shapes {
			if lib.Windowed(c.coll, coll.OneShotLL, c.world) {
				t.Fatalf("%s: oneshot_ll runs in rounds here; the case tests nothing", c.name)
			}
			need := lib.SlotBound(c.coll, coll.OneShotLL, c.world, sh.Bytes)
			if p.Staging < need {
				t.Errorf("%s: staging %d < the %d-byte inbox of shape %d (awkward %v): the forced kernel is skipped there",
					c.name, p.Staging, need, sh.Bytes, sh.Awkward)
			}
		}
	}
	// The same sizes in either order make the same plan's staging.
	cfg := Config{Library: lib, WorldSize: 4, Collective: coll.ReduceScatter, DType: coll.F32, Op: coll.Sum,
		Sizes: []int64{1 << 10, 256 << 20}, Algorithms: []string{"oneshot_ll"}}
	up, err := NewPlan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Sizes = []int64{256 << 20, 1 << 10}
	down, err := NewPlan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if up.Staging == 0 || down.Staging != up.Staging {
		t.Errorf("staging %d for sizes in descending order, %d ascending", down.Staging, up.Staging)
	}
}

// TestRunRankRefusesRankOutOfRange: a rank outside the world is an error
// naming both, not an index past Config.Devices.
func TestRunRankRefusesRankOutOfRange(t *testing.T) {
	cfg := Config{Library: collectives.Library, WorldSize: 2, Devices: []int{0, 1}, Collective: coll.AllReduce, DType: "f32", Op: "sum", Sizes: []int64{1024}}
	for _, rank := range []int{-1, 2} {
		_, err := RunRank(context.Background(), cfg, rank, rendezvous.NewMemStore())
		if err == nil || !strings.Contains(err.Error(), "world size 2") {
			t.Errorf("rank %d: %v; want an error naming the world size", rank, err)
		}
	}
}
