package numeric

import (
	"math"
	"testing"

	"github.com/collgen/collgen/coll"
)

// TestCheckSumRejectsNaN: a float sum that came out NaN or infinite from
// finite inputs is wrong. The tolerance test |got - want| > tol is false
// for a NaN got, so Check passed it (an output left holding 0xff bytes,
// NaN in every float type, passed too); an exact match (infinite inputs)
// and NaN from NaN inputs still pass.
func TestCheckSumRejectsNaN(t *testing.T) {
	for _, dt := range []coll.DType{coll.F32, coll.F64, coll.F16, coll.BF16} {
		for _, stepwise := range []bool{false, true} {
			ins := [][]byte{make([]byte, 2*dt.Size()), make([]byte, 2*dt.Size())}
			for _, in := range ins {
				Put(dt, in, 0, 1.5)
				Put(dt, in, 1, -0.25)
			}
			for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
				got := make([]byte, 2*dt.Size())
				Put(dt, got, 0, 3)
				Put(dt, got, 1, bad)
				if err := CheckWith(dt, coll.Sum, got, ins, stepwise); err == nil {
					t.Errorf("%s stepwise=%v: a sum of %v for -0.5 passed", dt, stepwise, bad)
				}
			}
			for _, special := range []float64{math.NaN(), math.Inf(1)} {
				Put(dt, ins[1], 1, special)
				got := make([]byte, 2*dt.Size())
				Put(dt, got, 0, 3)
				Put(dt, got, 1, special)
				if err := CheckWith(dt, coll.Sum, got, ins, stepwise); err != nil {
					t.Errorf("%s stepwise=%v: the sum of %v: %v", dt, stepwise, special, err)
				}
			}
		}
	}
}
