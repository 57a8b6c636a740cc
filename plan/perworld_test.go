package plan

import (
	"reflect"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/spec"
)

// A per-world select plans one selection per distinct rule list, with the
// world sizes sharing it; a world size the mapping leaves out gets NCCL and
// the list form keeps one selection for all world sizes.
func TestSelectionsPerWorld(t *testing.T) {
	s, err := spec.Parse("perworld.yaml", []byte(`version: 1
package: collectives
topologies:
  nvswitch:
    kind: nvlink_full
    world_sizes: [2-4, 8]
    generate:
      allreduce: [oneshot, twoshot]
      reduce_scatter: [oneshot]
    select:
      allreduce:
        2: [{upto: 1MiB, use: oneshot}]
        3: [{upto: 64KiB, use: oneshot}, {use: twoshot}]
        4: [{upto: 1MiB, use: oneshot}]
      reduce_scatter: [{upto: 1MiB, use: oneshot}]
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sel := func(c coll.Collective, worlds []int, rules ...kernels.Rule) kernels.Selection {
		return kernels.Selection{Topology: "nvswitch", Kind: coll.NVLinkFull, Collective: c, Worlds: worlds, Rules: rules}
	}
	want := []kernels.Selection{
		sel(coll.AllReduce, []int{2, 4}, kernels.Rule{UpTo: 1 << 20, Use: coll.OneShot}, kernels.Rule{Use: coll.NCCL}),
		sel(coll.AllReduce, []int{3}, kernels.Rule{UpTo: 64 << 10, Use: coll.OneShot}, kernels.Rule{Use: coll.TwoShot}),
		sel(coll.AllReduce, []int{8}, kernels.Rule{Use: coll.NCCL}),
		sel(coll.ReduceScatter, []int{2, 3, 4, 8}, kernels.Rule{UpTo: 1 << 20, Use: coll.OneShot}, kernels.Rule{Use: coll.NCCL}),
	}
	if !reflect.DeepEqual(p.Selections, want) {
		t.Errorf("selections\n got %+v\nwant %+v", p.Selections, want)
	}
}
