package spec_test

import (
	"errors"
	"fmt"

	"github.com/collgen/collgen/spec"
)

// Parse returns a validated *Spec, or every problem of the file at once as
// an ErrorList, each with its position.
func ExampleParse() {
	const yaml = `version: 1
package: mini
dtypes:
  reduce: [f32]
  copy: [f32]
ops: [sum]
topologies:
  pair:
    kind: nvlink_full
    world_sizes: [2]
    generate:
      allreduce: [oneshot]
    select:
      allreduce:
        - {upto: 64KiB, use: oneshot}
        - {use: nccl}
`
	s, err := spec.Parse("mini.yaml", []byte(yaml))
	if err != nil {
		panic(err)
	}
	fmt.Println(s.Package, len(s.Topologies))

	_, err = spec.Parse("bad.yaml", []byte("version: 1\npackage: Mini\nops: [sum, avg]\n"))
	var list spec.ErrorList
	fmt.Println(errors.As(err, &list), len(list))
	fmt.Println(err)
	// Output:
	// mini 1
	// true 3
	// bad.yaml:1:1: missing topologies; add e.g. topologies: {nvswitch: {kind: nvlink_full, world_sizes: [2-8], generate: {allreduce: [oneshot]}}}
	// bad.yaml:2:10: package "Mini" must be lower case; write package: mini
	// bad.yaml:3:12: unknown op "avg" (known: sum, max, min)
}
