package numeric

import (
	"math"
	"testing"

	"github.com/collgen/collgen/coll"
)

// TestCheckF64ReferenceOverflow: f64 inputs max, max, -max sum to
// max exactly; a kernel that adds them in another order (-max + max +
// max, a ring starting elsewhere) returns max, which is right. Check's
// float64 reference adds them in rank order, overflows to +Inf with no
// infinite input, and since infinite references pass only exactly, the
// right result fails (before, the infinite tolerance passed it, with
// anything else).
func TestCheckF64ReferenceOverflow(t *testing.T) {
	ins := [][]byte{make([]byte, 8), make([]byte, 8), make([]byte, 8)}
	Put(coll.F64, ins[0], 0, math.MaxFloat64)
	Put(coll.F64, ins[1], 0, math.MaxFloat64)
	Put(coll.F64, ins[2], 0, -math.MaxFloat64)
	got := make([]byte, 8)
	Put(coll.F64, got, 0, math.MaxFloat64)
	if err := Check(coll.F64, coll.Sum, got, ins); err != nil {
		t.Errorf("the exact sum failed: %v", err)
	}
	// Max + Max does overflow: +Inf passes, a finite result does not.
	two := ins[:2]
	for _, c := range []struct {
		g  float64
		ok bool
	}{{math.Inf(1), true}, {math.MaxFloat64, false}, {0, false}, {math.Inf(-1), false}} {
		Put(coll.F64, got, 0, c.g)
		if err := Check(coll.F64, coll.Sum, got, two); (err == nil) != c.ok {
			t.Errorf("max + max = %v: %v, want passing %v", c.g, err, c.ok)
		}
	}
}
