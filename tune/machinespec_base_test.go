package tune_test

import (
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/spec"
	"github.com/collgen/collgen/tune"
)

// TestMachineSpecBaseWithoutReduce: a valid base spec that has no
// reduce dtypes or no ops (it generates all-gathers only) gives a machine
// spec that loads (`collgen topo --spec FILE --base SPEC` said "internal
// error: the spec written for this machine does not load"): the machine's
// topologies generate what the base's dtypes and ops allow.
func TestMachineSpecBaseWithoutReduce(t *testing.T) {
	for name, text := range map[string]string{
		"no reduce dtypes or ops": `version: 1
package: agonly
dtypes: {reduce: [], copy: [e4m3, bf16]}
ops: []
topologies:
  nv:
    kind: nvlink_full
    world_sizes: [2-8]
    generate: {allgather: [oneshot, oneshot_ll]}
    select: {allgather: [{upto: 64KiB, use: oneshot_ll}, {use: nccl}]}
`,
		"no ops": `version: 1
package: agonly
ops: []
topologies:
  nv:
    kind: nvlink_full
    world_sizes: [2-8]
    generate: {allgather: [oneshot]}
`,
		"no copy dtypes": `version: 1
package: aronly
dtypes: {copy: []}
topologies:
  nv:
    kind: nvlink_full
    world_sizes: [2-8]
    generate: {allreduce: [oneshot]}
`,
	} {
		t.Run(name, func(t *testing.T) {
			base, err := spec.Parse("base.yaml", []byte(text))
			if err != nil {
				t.Fatal(err)
			}
			out, err := tune.MachineSpec(machine(t, "nvswitch8"), tune.SpecOptions{Base: base, BaseName: "base.yaml"})
			if err != nil {
				t.Fatal(err)
			}
			s, err := spec.Parse("machine.yaml", out)
			if err != nil {
				t.Fatalf("the machine spec does not load:\n%v\n%s", err, out)
			}
			nv := s.Topology("nvswitch")
			if nv == nil {
				t.Fatalf("no nvswitch topology:\n%s", out)
			}
			for _, c := range coll.Collectives() {
				gen := len(nv.Generate[c]) > 0
				if base.Topologies[0].Generate[c] != nil && !gen {
					t.Errorf("%s: the base generates it, the machine spec does not:\n%s", c, out)
				}
			}
		})
	}
}
