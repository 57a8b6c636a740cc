package spec

import (
	"reflect"
	"testing"

	"github.com/collgen/collgen/coll"
)

// perWorldSpec gives allreduce per world size and reduce_scatter as a list.
const perWorldSpec = `version: 1
package: collectives
topologies:
  nvswitch:
    kind: nvlink_full
    world_sizes: [2-4, 8]
    generate:
      allreduce: [oneshot, twoshot, oneshot_ll]
      reduce_scatter: [oneshot]
      allgather: [oneshot]
    select:
      allreduce:
        2:
          - {upto: 256KiB, use: oneshot_ll}
          - {upto: 64MiB, use: twoshot}
        "3-4":
          - {upto: 128KiB, use: oneshot_ll}
          - {use: oneshot}
      reduce_scatter:
        - {upto: 128KiB, use: oneshot}
        - {use: nccl}
      allgather: {}
  host:
    kind: host_shm
    world_sizes: [1-3]
    generate:
      allreduce: [oneshot, twoshot]
    select:
      allreduce:
        1: [{use: oneshot}]
        2-3: [{upto: 1MiB, use: oneshot}, {use: twoshot}]
`

func TestSelectPerWorld(t *testing.T) {
	s, err := Parse("perworld.yaml", []byte(perWorldSpec))
	if err != nil {
		t.Fatal(err)
	}
	nv := s.Topology("nvswitch")
	if nv.Select[coll.AllReduce] != nil {
		t.Errorf("per-world allreduce in Select: %v", nv.Select[coll.AllReduce])
	}
	if _, ok := nv.SelectByWorld[coll.AllGather]; ok {
		t.Errorf("an empty mapping must be as if allgather were left out: %v", nv.SelectByWorld[coll.AllGather])
	}
	w2 := []Rule{{UpTo: 256 << 10, Use: coll.OneShotLL}, {UpTo: 64 << 20, Use: coll.TwoShot}, {UpTo: 0, Use: coll.NCCL}}
	w34 := []Rule{{UpTo: 128 << 10, Use: coll.OneShotLL}, {UpTo: 0, Use: coll.OneShot}}
	rs := []Rule{{UpTo: 128 << 10, Use: coll.OneShot}, {UpTo: 0, Use: coll.NCCL}}
	want := map[coll.Collective]map[int][]Rule{
		coll.AllReduce:     {2: w2, 3: w34, 4: w34, 8: {{UpTo: 0, Use: coll.NCCL}}},
		coll.ReduceScatter: {2: rs, 3: rs, 4: rs, 8: rs},
	}
	if !reflect.DeepEqual(nv.SelectByWorld, want) {
		t.Errorf("SelectByWorld\n got %v\nwant %v", nv.SelectByWorld, want)
	}
	if !reflect.DeepEqual(nv.Select[coll.ReduceScatter], rs) {
		t.Errorf("list form Select: %v", nv.Select[coll.ReduceScatter])
	}
	for _, c := range []struct {
		t    *Topology
		c    coll.Collective
		w    int
		n    int64
		want coll.Algorithm
	}{
		{nv, coll.AllReduce, 2, 200 << 10, coll.OneShotLL},
		{nv, coll.AllReduce, 2, 1 << 20, coll.TwoShot},
		{nv, coll.AllReduce, 2, 1 << 30, coll.NCCL},
		{nv, coll.AllReduce, 3, 200 << 10, coll.OneShot},
		{nv, coll.AllReduce, 4, 1 << 30, coll.OneShot},
		{nv, coll.AllReduce, 8, 1, coll.NCCL},
		{nv, coll.ReduceScatter, 8, 1, coll.OneShot},
		{nv, coll.AllGather, 2, 1, coll.NCCL},
		{nv, coll.AllReduce, 5, 1, coll.NCCL}, // not a world size of nvswitch
		{s.Topology("host"), coll.AllReduce, 1, 1 << 30, coll.OneShot},
		{s.Topology("host"), coll.AllReduce, 3, 1 << 30, coll.TwoShot},
		{s.Topology("host"), coll.AllReduce, 2, 1 << 10, coll.OneShot},
	} {
		if got := c.t.ChooseFor(c.c, c.w, c.n); got != c.want {
			t.Errorf("%s ChooseFor(%s, %d, %d) = %q, want %q", c.t.Name, c.c, c.w, c.n, got, c.want)
		}
	}
}

// The list form fills SelectByWorld with the same rules at every size.
func TestSelectByWorldShipped(t *testing.T) {
	s, err := Load("collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range s.Topologies {
		for c, rules := range tp.Select {
			for _, w := range tp.WorldSizes {
				if !reflect.DeepEqual(tp.SelectByWorld[c][w], rules) {
					t.Errorf("%s %s world %d: %v, want %v", tp.Name, c, w, tp.SelectByWorld[c][w], rules)
				}
				for _, n := range []int64{1, 100 << 10, 3 << 20, 1 << 30} {
					if a, b := tp.ChooseFor(c, w, n), tp.Choose(c, n); a != b {
						t.Errorf("%s %s world %d %d bytes: ChooseFor %q, Choose %q", tp.Name, c, w, n, a, b)
					}
				}
			}
		}
	}
}
