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

// TestCheckRefusesWhatItCannotCheck: a dtype that is never reduced (fp8)
// or unknown, an unknown op, no sources or a short source are errors, not
// a panic (an index past a source, a division by a size of 0).
func TestCheckRefusesWhatItCannotCheck(t *testing.T) {
	got := make([]byte, 8)
	for _, c := range []struct {
		name  string
		dtype coll.DType
		op    coll.Op
		srcs  [][]byte
	}{
		{"e4m3", coll.E4M3, coll.Sum, [][]byte{make([]byte, 8)}},
		{"unknown dtype", coll.DType("f12"), coll.Sum, [][]byte{make([]byte, 8)}},
		{"unknown op", coll.F32, coll.Op("avg"), [][]byte{make([]byte, 8)}},
		{"no sources", coll.F32, coll.Sum, nil},
		{"short source", coll.F32, coll.Sum, [][]byte{make([]byte, 8), make([]byte, 4)}},
	} {
		if err := Check(c.dtype, c.op, got, c.srcs); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
}
