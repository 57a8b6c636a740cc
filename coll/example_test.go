package coll_test

import (
	"errors"
	"fmt"

	"github.com/collgen/collgen/coll"
)

// Names are parsed at the edges (flags, spec files) into typed values;
// an unknown one is an error that lists the known names.
func ExampleParseDType() {
	dt, err := coll.ParseDType("bf16")
	fmt.Println(dt, dt.Size(), err)

	_, err = coll.ParseDType("bfloat16")
	fmt.Println(errors.Is(err, coll.ErrUnknown))
	fmt.Println(err)
	// Output:
	// bf16 2 <nil>
	// true
	// unknown name: dtype "bfloat16" (known: f32, f16, bf16, f64, i32, i64, e4m3, e5m2)
}
