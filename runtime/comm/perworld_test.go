package comm

import (
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/plan"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/spec"
)

// perWorldLibrary is the generated library's kernels with the selections a
// per-world spec plans: different allreduce rules at world 2 and 4.
func perWorldLibrary(t *testing.T) *kernels.Library {
	t.Helper()
	s, err := spec.Parse("perworld.yaml", []byte(`version: 1
package: collectives
topologies:
  nvswitch:
    kind: nvlink_full
    world_sizes: [2, 4]
    generate:
      allreduce: [oneshot, twoshot, oneshot_ll]
    select:
      allreduce:
        2: [{upto: 1MiB, use: oneshot_ll}]
        4: [{upto: 64KiB, use: oneshot}, {upto: 1MiB, use: twoshot}]
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.New(s, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Selections) != 2 {
		t.Fatalf("%d selections, want one per world size's rule list: %+v", len(p.Selections), p.Selections)
	}
	return shippedWith(nil, p.Selections)
}

// The communicator takes the rules of its own world size from a per-world
// spec's selections.
func TestPerWorldSelection(t *testing.T) {
	lib := perWorldLibrary(t)
	for _, tc := range []struct {
		world int
		bytes int64
		want  coll.Algorithm
	}{
		{2, 32 << 10, coll.OneShotLL},
		{2, 512 << 10, coll.OneShotLL},
		{2, 4 << 20, coll.NCCL},
		{4, 32 << 10, coll.OneShot},
		{4, 512 << 10, coll.TwoShot},
		{4, 4 << 20, coll.NCCL},
	} {
		g, err := newTestGPU(t, Config{WorldSize: tc.world, Library: lib, DisableNCCL: true})
		if err != nil {
			t.Fatalf("world %d: %v", tc.world, err)
		}
		sel := g.rules(coll.AllReduce)
		if sel == nil || len(sel.Worlds) != 1 || sel.Worlds[0] != tc.world {
			t.Fatalf("world %d uses selection %+v", tc.world, sel)
		}
		if got := sel.Choose(tc.bytes, false); got != tc.want {
			t.Errorf("world %d, %d bytes: rules choose %q, want %q", tc.world, tc.bytes, got, tc.want)
		}
		if tc.want == coll.NCCL {
			continue
		}
		if got, err := frontOf(g).Choose(coll.AllReduce, tc.bytes, coll.BF16, coll.Sum); err != nil || got != tc.want {
			t.Errorf("world %d, %d bytes: Choose %q %v, want %q", tc.world, tc.bytes, got, err, tc.want)
		}
	}
	// World 2's LL area holds oneshot_ll up to 1 MiB; world 4 has no LL
	// rule, so it keeps only the smallest area.
	g2, _ := newTestGPU(t, Config{WorldSize: 2, Library: lib, DisableNCCL: true})
	g4, _ := newTestGPU(t, Config{WorldSize: 4, Library: lib, DisableNCCL: true})
	if g2.area[coll.LL] <= g4.area[coll.LL] {
		t.Errorf("LL areas: world 2 %d, world 4 %d; want world 2's larger", g2.area[coll.LL], g4.area[coll.LL])
	}
}
