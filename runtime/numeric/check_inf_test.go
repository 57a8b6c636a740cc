package numeric

import (
	"math"
	"testing"

	"github.com/collgen/collgen/coll"
)

// TestCheckSumInfiniteWant: where the reference sum is infinite (an
// input is +Inf), only that infinity may pass, as Check's comment says; a
// finite result, or -Inf, is wrong. The tolerance is infinite there
// (|x| sums the infinite input), so |got - want| <= tol held for any
// non-NaN got.
func TestCheckSumInfiniteWant(t *testing.T) {
	for _, dt := range []coll.DType{coll.F32, coll.F64, coll.F16, coll.BF16} {
		for _, stepwise := range []bool{false, true} {
			ins := [][]byte{make([]byte, dt.Size()), make([]byte, dt.Size())}
			Put(dt, ins[0], 0, 1.5)
			Put(dt, ins[1], 0, math.Inf(1))
			for _, bad := range []float64{1.5, 0, math.Inf(-1)} {
				got := make([]byte, dt.Size())
				Put(dt, got, 0, bad)
				if err := CheckWith(dt, coll.Sum, got, ins, stepwise); err == nil {
					t.Errorf("%s stepwise=%v: a sum of %v for +Inf passed", dt, stepwise, bad)
				}
			}
		}
	}
}

// TestCheckSumOverflowToInf: a float sum of finite inputs whose exact
// value lies beyond the largest finite value of the output type rounds to
// infinity once rounded to dtype ("rounding once to dtype", Check's bound):
// f16 60000 + 60000 is +Inf in f16 from any kernel accumulating in f32 and
// from NCCL. Check compared it with the unrounded 120000 and failed it.
func TestCheckSumOverflowToInf(t *testing.T) {
	for _, c := range []struct {
		dt coll.DType
		v  float64
	}{{coll.F16, 60000}, {coll.BF16, 3e38}, {coll.F32, 3e38}} {
		ins := [][]byte{make([]byte, c.dt.Size()), make([]byte, c.dt.Size())}
		Put(c.dt, ins[0], 0, c.v)
		Put(c.dt, ins[1], 0, c.v)
		got := make([]byte, c.dt.Size())
		Put(c.dt, got, 0, math.Inf(1))
		if err := Check(c.dt, coll.Sum, got, ins); err != nil {
			t.Errorf("%s: %v + %v rounded to +Inf failed: %v", c.dt, c.v, c.v, err)
		}
		Put(c.dt, got, 0, math.Inf(-1))
		if err := Check(c.dt, coll.Sum, got, ins); err == nil {
			t.Errorf("%s: %v + %v as -Inf passed", c.dt, c.v, c.v)
		}
	}
}
