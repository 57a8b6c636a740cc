package tune_test

import (
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/spec"
	"github.com/collgen/collgen/tune"
)

// TestReplaceSelectKeepsAliasedSelect: a topology whose select is an
// alias of another's (or comes in through a merge key) keeps the rules of
// the collectives that are not tuned.
func TestReplaceSelectKeepsAliasedSelect(t *testing.T) {
	for name, data := range map[string]string{
		"alias": `version: 1
package: p
topologies:
  a:
    kind: nvlink_full
    world_sizes: [2]
    generate: {allreduce: [oneshot], allgather: [oneshot]}
    select: &sel
      allreduce: [{upto: 1KiB, use: oneshot}]
      allgather: [{upto: 2KiB, use: oneshot}]
  b:
    kind: nvlink_full
    world_sizes: [4]
    generate: {allreduce: [oneshot], allgather: [oneshot]}
    select: *sel
`,
		"merge": `version: 1
package: p
topologies:
  a: &a
    kind: nvlink_full
    world_sizes: [2]
    generate: {allreduce: [oneshot], allgather: [oneshot]}
    select:
      allreduce: [{upto: 1KiB, use: oneshot}]
      allgather: [{upto: 2KiB, use: oneshot}]
  b:
    <<: *a
    world_sizes: [4]
`,
	} {
		t.Run(name, func(t *testing.T) {
			before, err := spec.Parse("s.yaml", []byte(data))
			if err != nil {
				t.Fatal(err)
			}
			rules := map[coll.Collective][]spec.Rule{coll.AllReduce: {{UpTo: 4096, Use: "oneshot"}, {Use: "nccl"}}}
			out, err := tune.ReplaceSelect("s.yaml", []byte(data), "b", rules, "")
			if err != nil {
				t.Fatal(err)
			}
			after, err := spec.Parse("s.yaml", out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			checkOnlyTuned(t, before, after, "b", rules, out)
		})
	}
}
