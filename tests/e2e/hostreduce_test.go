package e2e

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/numeric"
)

// refReduce is the host reduce loops' definition, written the way the
// generator emitted them before the fused loops: an accumulator (float32
// for f16 and bf16) starts at srcs[0], takes every further source in order
// with combine, and is rounded to dst once at the end. The generated loops
// must match it bitwise.
func refReduce(dtype coll.DType, op coll.Op, dst []byte, srcs [][]byte) {
	switch dtype {
	case coll.F32:
		refLoop(dst, srcs, func(v float32) float32 { return v }, func(a float32) float32 { return a }, refCombine[float32](op, true))
	case coll.F64:
		refLoop(dst, srcs, func(v float64) float64 { return v }, func(a float64) float64 { return a }, refCombine[float64](op, true))
	case coll.I32:
		refLoop(dst, srcs, func(v int32) int32 { return v }, func(a int32) int32 { return a }, refCombine[int32](op, false))
	case coll.I64:
		refLoop(dst, srcs, func(v int64) int64 { return v }, func(a int64) int64 { return a }, refCombine[int64](op, false))
	case coll.F16:
		refLoop(dst, srcs, numeric.F16ToF32, numeric.F32ToF16, refCombine[float32](op, true))
	case coll.BF16:
		refLoop(dst, srcs, numeric.BF16ToF32, numeric.F32ToBF16, refCombine[float32](op, true))
	default:
		panic("no host loop for " + string(dtype))
	}
}

func refLoop[T, A any](dst []byte, srcs [][]byte, up func(T) A, down func(A) T, combine func(a, x A) A) {
	d := view[T](dst)
	acc := make([]A, len(d))
	for i, v := range view[T](srcs[0])[:len(d)] {
		acc[i] = up(v)
	}
	for _, src := range srcs[1:] {
		for i, v := range view[T](src)[:len(d)] {
			acc[i] = combine(acc[i], up(v))
		}
	}
	for i, a := range acc {
		d[i] = down(a)
	}
}

// refCombine is one step of op: sums wrap for integers; max and min
// follow maxNum/minNum for floats (a NaN accumulator takes the next value,
// a NaN value never replaces a number) and order equal zeros as the GPUs
// do (max prefers +0, min -0).
func refCombine[A int32 | int64 | float32 | float64](op coll.Op, float bool) func(a, x A) A {
	switch op {
	case coll.Sum:
		return func(a, x A) A { return a + x }
	case coll.Max, coll.Min:
		return func(a, x A) A {
			better := x > a
			if op == coll.Min {
				better = x < a
			}
			if float {
				sa, sx := math.Signbit(float64(a)), math.Signbit(float64(x))
				prefer := !sx
				if op == coll.Min {
					prefer = sx
				}
				better = better || a != a || x == a && sa != sx && prefer
			}
			if better {
				return x
			}
			return a
		}
	}
	panic("unknown op " + string(op))
}

func view[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

// randomElems fills b with random elements of dtype; floats include NaN,
// ±0, ±Inf, subnormals and repeated values, so max/min see ties, zeros of
// both signs and NaN at every source position.
func randomElems(rng *rand.Rand, dtype coll.DType, b []byte) {
	esz := dtype.Size()
	for i := 0; i < len(b); i += esz {
		var f float64
		switch k := rng.IntN(16); {
		case k == 0:
			f = math.NaN()
		case k == 1:
			f = 0
		case k == 2:
			f = math.Copysign(0, -1)
		case k == 3:
			f = math.Inf(1 - 2*rng.IntN(2))
		case k == 4:
			f = float64(rng.IntN(3) - 1) // ties
		case k == 5:
			f = math.SmallestNonzeroFloat32 * float64(rng.IntN(100)-50)
		default:
			f = rng.NormFloat64() * math.Pow(2, float64(rng.IntN(40)-20))
		}
		e := b[i : i+esz]
		switch dtype {
		case coll.F32, coll.F64, coll.F16, coll.BF16:
			copy(e, encode(dtype, f))
		default:
			for j := range e {
				e[j] = byte(rng.Uint32())
			}
			if rng.IntN(8) == 0 { // ties and extremes
				for j := range e {
					e[j] = []byte{0, 0xff, 0x7f, 0x80}[rng.IntN(4)]
				}
			}
		}
	}
}

// TestHostReduceMatchesReference checks every generated host reduce loop
// bitwise against refReduce over random data (NaN, ±0, ±Inf, subnormals,
// ties) for source counts 1..9 and 16, 17, at lengths around the
// 1024-element blocks of the loop for more than 8 sources, also with dst
// aliasing srcs[0] (in-place reduce-scatter passes the same chunk as both).
func TestHostReduceMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	lengths := []int{0, 1, 3, 7, 8, 9, 63, 1023, 1024, 1025, 3000}
	nsrcs := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17}
	for _, dt := range numeric.DTypes {
		for _, op := range coll.Ops() {
			f, ok := collectives.Library.HostReducer(dt, op)
			if !ok {
				t.Fatalf("no host reduce loop for %s %s", dt, op)
			}
			for _, ns := range nsrcs {
				for _, n := range lengths {
					srcs := make([][]byte, ns)
					for i := range srcs {
						srcs[i] = make([]byte, n*dt.Size())
						randomElems(rng, dt, srcs[i])
					}
					want := make([]byte, n*dt.Size())
					refReduce(dt, op, want, srcs)
					got := make([]byte, n*dt.Size())
					f(got, srcs)
					if i := firstDiff(dt, op, got, want); i >= 0 {
						t.Fatalf("%s %s, %d sources, %d elements: element %d is %x, want %x", dt, op, ns, n, i, got[i*dt.Size():(i+1)*dt.Size()], want[i*dt.Size():(i+1)*dt.Size()])
					}
					// In place: dst is srcs[0].
					inPlace := append([][]byte{append([]byte(nil), srcs[0]...)}, srcs[1:]...)
					f(inPlace[0], inPlace)
					if firstDiff(dt, op, inPlace[0], want) >= 0 {
						t.Fatalf("%s %s, %d sources, %d elements, in place: differs from the reference", dt, op, ns, n)
					}
				}
			}
		}
	}
}

// firstDiff returns the first element where a and b differ bitwise, or -1.
// Sums of NaNs are the exception: which NaN an add returns when both
// operands are NaN (its sign and payload) depends on the operand order
// the compiler picks for the commutative instruction, so there any NaN
// matches any NaN. Max and min select an operand, so their NaNs must match
// bit for bit.
func firstDiff(dt coll.DType, op coll.Op, a, b []byte) int {
	esz := dt.Size()
	for i := 0; i < len(a); i += esz {
		x, y := a[i:i+esz], b[i:i+esz]
		if bytes.Equal(x, y) || op == coll.Sum && dt.IsFloat() && math.IsNaN(decode(dt, x)) && math.IsNaN(decode(dt, y)) {
			continue
		}
		return i / esz
	}
	return -1
}

// BenchmarkHostReduce times the generated host reduce loops on 64 KiB per
// source (in L2, as a lane's piece chunks mostly are) and reports ns per
// output element (ns/elem) and per element and source (ns/elem-src).
//
//	go test ./tests/e2e -run '^$' -bench HostReduce -benchtime 2000x
func BenchmarkHostReduce(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, key := range []kernels.HostKey{
		{DType: coll.F32, Op: coll.Sum}, {DType: coll.BF16, Op: coll.Sum},
		{DType: coll.F32, Op: coll.Max}, {DType: coll.I32, Op: coll.Sum},
	} {
		f, _ := collectives.Library.HostReducer(key.DType, key.Op)
		for _, ns := range []int{2, 4, 8, 16} {
			n := 64 << 10 / key.DType.Size()
			srcs := make([][]byte, ns)
			for i := range srcs {
				srcs[i] = make([]byte, n*key.DType.Size())
				randomElems(rng, key.DType, srcs[i])
			}
			dst := make([]byte, n*key.DType.Size())
			b.Run(fmt.Sprintf("%s/%s/src%d", key.DType, key.Op, ns), func(b *testing.B) {
				b.SetBytes(int64(len(dst) * (ns + 1)))
				for b.Loop() {
					f(dst, srcs)
				}
				per := float64(b.Elapsed().Nanoseconds()) / float64(b.N) / float64(n)
				b.ReportMetric(per, "ns/elem")
				b.ReportMetric(per/float64(ns), "ns/elem-src")
			})
		}
	}
}
