package numeric

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/collgen/collgen/coll"
)

// Get returns element i of b as a float64 (integers convert exactly up to
// 2^53; use GetInt for exact integer work).
func Get(dtype coll.DType, b []byte, i int) float64 {
	switch dtype {
	case coll.F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case coll.F64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	case coll.F16:
		return float64(F16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	case coll.BF16:
		return float64(BF16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	}
	return float64(GetInt(dtype, b, i))
}

// GetInt returns integer element i of b (i32 or i64).
func GetInt(dtype coll.DType, b []byte, i int) int64 {
	if dtype == coll.I32 {
		return int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return int64(binary.LittleEndian.Uint64(b[8*i:]))
}

// Put stores v, rounded to dtype, as element i of b.
func Put(dtype coll.DType, b []byte, i int, v float64) {
	switch dtype {
	case coll.F32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case coll.F64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	case coll.F16:
		binary.LittleEndian.PutUint16(b[2*i:], F32ToF16(float32(v)))
	case coll.BF16:
		binary.LittleEndian.PutUint16(b[2*i:], F32ToBF16(float32(v)))
	case coll.I32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
	case coll.I64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(v)))
	}
}

// Fill writes deterministic pseudo-random test data for (seed, rank) into
// b: integers in [-1000, 1000], floats in [-4, 4) with a few distinct
// exponents, so that sums are well conditioned and max/min have ties only
// by chance.
func Fill(dtype coll.DType, b []byte, seed, rank int) {
	r := rand.New(rand.NewPCG(uint64(seed), uint64(rank)+1))
	n := len(b) / dtype.Size()
	for i := 0; i < n; i++ {
		if !dtype.IsFloat() {
			Put(dtype, b, i, float64(r.IntN(2001)-1000))
			continue
		}
		Put(dtype, b, i, r.Float64()*8-4)
	}
}

// unitRoundoff returns the unit roundoff of the arithmetic the host loops
// accumulate in for dtype, and of the type the result is stored in.
func unitRoundoff(dtype coll.DType) (acc, out float64) {
	switch dtype {
	case coll.F32:
		return 0x1p-24, 0x1p-24
	case coll.F64:
		return 0x1p-53, 0x1p-53
	case coll.F16:
		return 0x1p-24, 0x1p-11
	case coll.BF16:
		return 0x1p-24, 0x1p-8
	}
	return 0, 0
}

// Check verifies that got[i] equals op over srcs[0][i], srcs[1][i], ... for
// every element of got. Integers and max/min must match exactly (integer
// sums wrap like two's complement hardware); float sums are compared with a
// float64 reference within the error bound of summing len(srcs) terms in
// the accumulation type and rounding once to dtype:
//
//	|got - ref| <= (len(srcs) * u_acc) * sum|x| + u_out * |ref|, doubled for slack.
func Check(dtype coll.DType, op coll.Op, got []byte, srcs [][]byte) error {
	return CheckWith(dtype, op, got, srcs, false)
}

// CheckWith is Check; with stepwise it allows the error of a library that
// rounds to dtype after every addition (NCCL reduces bf16 in bf16), not
// once at the end: the accumulation bound uses dtype's own unit roundoff.
func CheckWith(dtype coll.DType, op coll.Op, got []byte, srcs [][]byte, stepwise bool) error {
	// A reduction's dtypes only (fp8 is copied, never reduced): others
	// would index past b in Get or divide by a size of 0.
	if err := CheckDType(dtype); err != nil {
		return fmt.Errorf("numeric: check: %w", err)
	}
	if err := CheckOp(op); err != nil {
		return fmt.Errorf("numeric: check: %w", err)
	}
	if len(srcs) == 0 {
		return fmt.Errorf("numeric: check of %d bytes of %s: no sources", len(got), dtype)
	}
	n := len(got) / dtype.Size()
	for r, s := range srcs {
		if len(s) < n*dtype.Size() {
			return fmt.Errorf("numeric: check of %d %s elements: source %d has %d bytes", n, dtype, r, len(s))
		}
	}
	isInt := !dtype.IsFloat()
	uAcc, uOut := unitRoundoff(dtype)
	if stepwise {
		uAcc = uOut
	}
	for i := 0; i < n; i++ {
		if isInt {
			want := GetInt(dtype, srcs[0], i)
			for _, s := range srcs[1:] {
				v := GetInt(dtype, s, i)
				switch op {
				case coll.Sum:
					want += v
				case coll.Max:
					want = max(want, v)
				case coll.Min:
					want = min(want, v)
				}
			}
			if dtype == coll.I32 {
				want = int64(int32(want))
			}
			if g := GetInt(dtype, got, i); g != want {
				return fmt.Errorf("%s %s: element %d is %d, want %d", dtype, op, i, g, want)
			}
			continue
		}
		want := Get(dtype, srcs[0], i)
		abs := math.Abs(want)
		for _, s := range srcs[1:] {
			v := Get(dtype, s, i)
			switch op {
			case coll.Sum:
				want += v
				abs += math.Abs(v)
			case coll.Max:
				want = maxNum(want, v)
			case coll.Min:
				want = minNum(want, v)
			}
		}
		g := Get(dtype, got, i)
		// An infinite sum of finite inputs (f64 only: float64 overflowed
		// in rank order) may be finite in another order: the terms are
		// summed again halved (exactly, but for subnormals' last bits), and
		// got is compared halved.
		scale := 1.0
		if op == coll.Sum && math.IsInf(want, 0) && !anyInf(dtype, srcs, i) {
			scale, want, abs = 2, 0, 0
			for _, s := range srcs {
				v := Get(dtype, s, i) / 2
				want += v
				abs += math.Abs(v)
			}
		}
		if op != coll.Sum {
			if (g != want || math.Signbit(g) != math.Signbit(want)) && !(math.IsNaN(g) && math.IsNaN(want)) {
				return fmt.Errorf("%s %s: element %d is %v, want exactly %v", dtype, op, i, g, want)
			}
			continue
		}
		tol := 2 * (float64(len(srcs))*uAcc*abs + uOut*math.Abs(want))
		// Written so that a NaN got fails (a comparison with NaN is false)
		// unless want is NaN too; an infinite want passes only exactly (the
		// tolerance is infinite there: abs sums the infinite input). An
		// infinite got of a finite want passes where the sum, within the
		// tolerance towards it, overflows dtype once rounded to it.
		var ok bool
		switch {
		case g/scale == want || math.IsNaN(g) && math.IsNaN(want):
			ok = true
		case math.IsInf(want, 0):
		case math.IsInf(g, 0):
			ok = roundTo(dtype, scale*(want+math.Copysign(tol, g))) == g
		default:
			ok = math.Abs(g/scale-want) <= tol
		}
		if !ok {
			return fmt.Errorf("%s sum of %d: element %d is %v, want %v within %.3g", dtype, len(srcs), i, g, scale*want, scale*tol)
		}
	}
	return nil
}

// anyInf reports whether element i of a source is infinite.
func anyInf(dtype coll.DType, srcs [][]byte, i int) bool {
	for _, s := range srcs {
		if math.IsInf(Get(dtype, s, i), 0) {
			return true
		}
	}
	return false
}

// roundTo is v rounded to the float type dtype (infinite beyond its range).
func roundTo(dtype coll.DType, v float64) float64 {
	switch dtype {
	case coll.F32:
		return float64(float32(v))
	case coll.F16:
		return float64(F16ToF32(F32ToF16(float32(v))))
	case coll.BF16:
		return float64(BF16ToF32(F32ToBF16(float32(v))))
	}
	return v
}

// maxNum and minNum are IEEE maxNum and minNum as the kernels and the host
// loops compute them (docs/numerics.md; the portable Reducer too): a NaN
// operand is ignored unless both are NaN, and +0 is above -0 (math.Max and
// math.Min order zeros so in either order).
func maxNum(a, b float64) float64 { return ignoreNaN(a, b, math.Max) }

func minNum(a, b float64) float64 { return ignoreNaN(a, b, math.Min) }

// ignoreNaN is f(a, b), or the operand that is not NaN where one is.
func ignoreNaN(a, b float64, f func(a, b float64) float64) float64 {
	switch {
	case math.IsNaN(b):
		return a
	case math.IsNaN(a):
		return b
	}
	return f(a, b)
}
