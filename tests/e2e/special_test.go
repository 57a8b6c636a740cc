package e2e

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/numeric"
)

// TestHostMaxMinIgnoreNaN checks the generated host reduce loops treat a
// NaN operand as the CUDA kernels and NCCL do (maxNum/minNum): ignored
// unless every operand is NaN, whatever its position among the sources;
// and order zeros as the GPUs do (max prefers +0, min -0).
func TestHostMaxMinIgnoreNaN(t *testing.T) {
	nan, negZero := math.NaN(), math.Copysign(0, -1)
	cases := []struct {
		op   coll.Op
		srcs []float64
		want float64 // NaN means NaN
	}{
		{coll.Max, []float64{nan, 1}, 1},
		{coll.Max, []float64{1, nan}, 1},
		{coll.Max, []float64{nan, -2, 1}, 1},
		{coll.Max, []float64{-2, nan, 1}, 1},
		{coll.Max, []float64{nan, nan}, nan},
		{coll.Max, []float64{math.Inf(-1), nan}, math.Inf(-1)},
		{coll.Min, []float64{nan, 1}, 1},
		{coll.Min, []float64{1, nan}, 1},
		{coll.Min, []float64{3, nan, 2}, 2},
		{coll.Min, []float64{nan, nan, nan}, nan},
		{coll.Min, []float64{math.Inf(1), nan}, math.Inf(1)},
		{coll.Max, []float64{negZero, 0}, 0},
		{coll.Max, []float64{0, negZero}, 0},
		{coll.Min, []float64{negZero, 0}, negZero},
		{coll.Min, []float64{0, negZero}, negZero},
		{coll.Max, []float64{negZero, nan}, negZero},
	}
	for _, d := range []coll.DType{coll.F32, coll.F64, coll.F16, coll.BF16} {
		for _, c := range cases {
			f, ok := collectives.Library.HostReducer(d, c.op)
			if !ok {
				continue
			}
			srcs := make([][]byte, len(c.srcs))
			for i, v := range c.srcs {
				srcs[i] = encode(d, v)
			}
			dst := make([]byte, d.Size())
			f(dst, srcs)
			got := decode(d, dst)
			if math.IsNaN(c.want) != math.IsNaN(got) || (!math.IsNaN(got) && (got != c.want || math.Signbit(got) != math.Signbit(c.want))) {
				t.Errorf("%s %s of %v = %v, want %v", d, c.op, c.srcs, got, c.want)
			}
		}
	}
}

func encode(d coll.DType, v float64) []byte {
	b := make([]byte, d.Size())
	switch d {
	case coll.F32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case coll.F64:
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
	case coll.F16:
		binary.LittleEndian.PutUint16(b, numeric.F32ToF16(float32(v)))
	case coll.BF16:
		binary.LittleEndian.PutUint16(b, numeric.F32ToBF16(float32(v)))
	}
	return b
}

func decode(d coll.DType, b []byte) float64 {
	switch d {
	case coll.F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
	case coll.F64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	case coll.F16:
		return float64(numeric.F16ToF32(binary.LittleEndian.Uint16(b)))
	}
	return float64(numeric.BF16ToF32(binary.LittleEndian.Uint16(b)))
}
