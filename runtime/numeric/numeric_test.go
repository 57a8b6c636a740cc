package numeric

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/collgen/collgen/coll"
)

func TestHalfRoundTrip(t *testing.T) {
	// Every f16 and bf16 bit pattern converts to f32 and back unchanged
	// (NaNs stay NaN).
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		if math.IsNaN(float64(f)) {
			if g := F32ToF16(f); g&0x7c00 != 0x7c00 || g&0x3ff == 0 {
				t.Fatalf("f16 NaN %#04x -> %#04x", h, g)
			}
			continue
		}
		if g := F32ToF16(f); g != uint16(h) {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, g)
		}
		b := BF16ToF32(uint16(h))
		if math.IsNaN(float64(b)) {
			continue
		}
		if g := F32ToBF16(b); g != uint16(h) {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, b, g)
		}
	}
}

func TestHalfRounding(t *testing.T) {
	cases := []struct {
		f    float32
		want uint16
	}{
		{1, 0x3c00},
		{1 + 0x1p-11, 0x3c00},   // tie to even (down)
		{1 + 3*0x1p-11, 0x3c02}, // tie to even (up)
		{65504, 0x7bff},         // max
		{65520, 0x7c00},         // rounds to inf
		{0x1p-24, 0x0001},       // smallest subnormal
		{0x1p-25, 0x0000},       // tie to even zero
		{-2, 0xc000},
	}
	for _, c := range cases {
		if got := F32ToF16(c.f); got != c.want {
			t.Errorf("F32ToF16(%v) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if got := F32ToBF16(1 + 0x1p-8); got != 0x3f80 {
		t.Errorf("bf16 tie: %#04x", got)
	}
	if got := F32ToBF16(1 + 3*0x1p-8); got != 0x3f82 {
		t.Errorf("bf16 tie up: %#04x", got)
	}
}

func TestReducersMatchCheck(t *testing.T) {
	for _, dt := range DTypes {
		for _, op := range coll.Ops() {
			f, err := Reducer(dt, op)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{0, 1, 7, 1023, 1025, 3000} {
				var srcs [][]byte
				for r := 0; r < 5; r++ {
					b := make([]byte, n*dt.Size())
					Fill(dt, b, n, r)
					srcs = append(srcs, b)
				}
				dst := make([]byte, n*dt.Size())
				f(dst, srcs)
				if err := Check(dt, op, dst, srcs); err != nil {
					t.Fatalf("n=%d: %v", n, err)
				}
				// dst aliasing the first source.
				keep := append([]byte(nil), srcs[0]...)
				f(srcs[0], srcs)
				srcs[0], keep = keep, srcs[0]
				if err := Check(dt, op, keep, srcs); err != nil {
					t.Fatalf("aliased n=%d: %v", n, err)
				}
			}
		}
	}
}

// TestMaxMinSemantics: Reducer and Check follow maxNum and minNum (a NaN
// operand ignored unless all are NaN, +0 above -0 in either order), as the
// kernels and the generated host loops do; the portable Reducer propagated
// NaN and kept whichever zero came first (FuzzHostReducers found it).
func TestMaxMinSemantics(t *testing.T) {
	nan, negZero := math.NaN(), math.Copysign(0, -1)
	f32 := func(vs ...float64) []byte {
		b := make([]byte, 4*len(vs))
		for i, v := range vs {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		}
		return b
	}
	for _, c := range []struct {
		op         coll.Op
		a, b, want float64
	}{
		{coll.Max, nan, 1, 1}, {coll.Max, 1, nan, 1}, {coll.Max, negZero, 0, 0}, {coll.Max, 0, negZero, 0},
		{coll.Min, nan, -1, -1}, {coll.Min, -1, nan, -1}, {coll.Min, 0, negZero, negZero}, {coll.Min, negZero, 0, negZero},
		{coll.Max, nan, nan, nan},
	} {
		f, err := Reducer(coll.F32, c.op)
		if err != nil {
			t.Fatal(err)
		}
		srcs := [][]byte{f32(c.a), f32(c.b)}
		got := make([]byte, 4)
		f(got, srcs)
		g := float64(math.Float32frombits(binary.LittleEndian.Uint32(got)))
		if !(g == c.want && math.Signbit(g) == math.Signbit(c.want)) && !(math.IsNaN(g) && math.IsNaN(c.want)) {
			t.Errorf("%s(%v, %v) = %v, want %v", c.op, c.a, c.b, g, c.want)
		}
		if err := Check(coll.F32, c.op, f32(c.want), srcs); err != nil {
			t.Errorf("Check refuses %s(%v, %v) = %v: %v", c.op, c.a, c.b, c.want, err)
		}
	}
	if err := Check(coll.F32, coll.Max, f32(nan), [][]byte{f32(nan), f32(1)}); err == nil {
		t.Error("Check accepts NaN for max(NaN, 1)")
	}
	if err := Check(coll.F32, coll.Min, f32(0), [][]byte{f32(0), f32(negZero)}); err == nil {
		t.Error("Check accepts +0 for min(+0, -0)")
	}
}
