package numeric

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/collgen/collgen/coll"
)

// block is how many elements the portable loops accumulate at a time: the
// accumulator stays in L1 while every source streams through once.
const block = 1024

// ReduceFunc has the contract of kernels.HostReduceFunc: dst[i] = srcs[0][i]
// op srcs[1][i] op ..., in source order; dst may alias any source; f16 and
// bf16 accumulate in f32 and round once.
type ReduceFunc = func(dst []byte, srcs [][]byte)

// Reducer returns a portable reduce loop for dtype and op. The generated
// library's loops replace it in production; this one backs tests and a
// bench built without generated code.
func Reducer(dtype coll.DType, op coll.Op) (ReduceFunc, error) {
	if err := CheckDType(dtype); err != nil {
		return nil, err
	}
	if err := CheckOp(op); err != nil {
		return nil, err
	}
	switch dtype {
	case coll.F32:
		return typed[float32](op), nil
	case coll.F64:
		return typed[float64](op), nil
	case coll.I32:
		return typed[int32](op), nil
	case coll.I64:
		return typed[int64](op), nil
	case coll.F16:
		return half(op, F16ToF32, F32ToF16), nil
	case coll.BF16:
		return half(op, BF16ToF32, F32ToBF16), nil
	}
	return nil, fmt.Errorf("no reducer for %s %s", dtype, op)
}

type number interface {
	~float32 | ~float64 | ~int32 | ~int64
}

// view reinterprets b as a slice of T; b must be aligned for T (Go
// allocations and mmapped segments are, and collgen's chunk offsets keep
// element alignment).
func view[T number](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

func combine[T number](op coll.Op) func(acc, s []T) {
	switch op {
	case coll.Sum:
		return func(acc, s []T) {
			s = s[:len(acc)]
			for i := range acc {
				acc[i] += s[i]
			}
		}
	case coll.Max:
		return func(acc, s []T) {
			s = s[:len(acc)]
			for i := range acc {
				// maxNum, as the kernels and the generated loops
				// (docs/numerics.md): a NaN operand is ignored unless
				// every one is NaN, and +0 is above -0 in either order.
				x, a := s[i], acc[i]
				if x == x && (a != a || x > a || x == 0 && a == 0 && !math.Signbit(float64(x))) {
					acc[i] = x
				}
			}
		}
	default:
		return func(acc, s []T) {
			s = s[:len(acc)]
			for i := range acc {
				// minNum: NaN ignored as for max, -0 below +0.
				x, a := s[i], acc[i]
				if x == x && (a != a || x < a || x == 0 && a == 0 && math.Signbit(float64(x))) {
					acc[i] = x
				}
			}
		}
	}
}

func typed[T number](op coll.Op) ReduceFunc {
	comb := combine[T](op)
	return func(dst []byte, srcs [][]byte) {
		d := view[T](dst)
		ss := make([][]T, len(srcs))
		for j, s := range srcs {
			ss[j] = view[T](s)
		}
		var buf [block]T
		for lo := 0; lo < len(d); lo += block {
			hi := min(lo+block, len(d))
			acc := buf[:hi-lo]
			copy(acc, ss[0][lo:hi])
			for j := 1; j < len(ss); j++ {
				comb(acc, ss[j][lo:hi])
			}
			copy(d[lo:hi], acc)
		}
	}
}

func half(op coll.Op, toF32 func(uint16) float32, fromF32 func(float32) uint16) ReduceFunc {
	comb := combine[float32](op)
	return func(dst []byte, srcs [][]byte) {
		d := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(dst))), len(dst)/2)
		var acc, tmp [block]float32
		for lo := 0; lo < len(d); lo += block {
			hi := min(lo+block, len(d))
			a := acc[:hi-lo]
			for j, s := range srcs {
				src := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(s))), len(s)/2)[lo:hi]
				t := a
				if j > 0 {
					t = tmp[:hi-lo]
				}
				for i, v := range src {
					t[i] = toF32(v)
				}
				if j > 0 {
					comb(a, t)
				}
			}
			for i, v := range a {
				d[lo+i] = fromF32(v)
			}
		}
	}
}
