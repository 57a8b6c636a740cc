package host

import (
	"bytes"
	"math"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/numeric"
)

// FuzzHostReducers: the generated host reduce loops (the Library's, which
// production runs) and numeric's portable ones agree on any input bits,
// NaNs, infinities, zeros of both signs and subnormals included, for 1-5
// sources and any length, also with the destination aliasing the first
// source. Two NaNs count as equal (payload bits are Go's, docs/numerics.md);
// every other result must be the same bits.
func FuzzHostReducers(f *testing.F) {
	f.Add(uint8(0), uint8(0), uint8(2), []byte{0, 0, 0xc0, 0x7f, 0, 0, 0x80, 0xff, 0, 0, 0, 0x80, 0, 0, 0, 0})
	f.Add(uint8(2), uint8(1), uint8(3), bytes.Repeat([]byte{0x7f, 0xc0, 0x80, 0x00, 0x01, 0x00}, 20))
	f.Fuzz(func(t *testing.T, di, oi, ns uint8, data []byte) {
		dt := numeric.DTypes[int(di)%len(numeric.DTypes)]
		op := coll.Ops()[int(oi)%len(coll.Ops())]
		n := 1 + int(ns)%5
		size := dt.Size()
		elems := len(data) / size / n
		if elems == 0 {
			return
		}
		srcs := make([][]byte, n)
		for r := range srcs {
			srcs[r] = data[r*elems*size : (r+1)*elems*size]
		}
		gen, ok := testLibrary.HostReducer(dt, op)
		if !ok {
			t.Skipf("no generated host loop for %s %s", dt, op)
		}
		ref, err := numeric.Reducer(dt, op)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, elems*size)
		ref(want, srcs)
		got := make([]byte, elems*size)
		gen(got, srcs)
		compare(t, dt, op, "", got, want, srcs)
		alias := make([][]byte, n) // the destination is the first source
		for r := range alias {
			alias[r] = append([]byte(nil), srcs[r]...)
		}
		gen(alias[0], alias)
		compare(t, dt, op, " (aliased)", alias[0], want, srcs)
	})
}

// compare fails t at the first element of got that differs from want,
// NaN matching NaN.
func compare(t *testing.T, dt coll.DType, op coll.Op, what string, got, want []byte, srcs [][]byte) {
	t.Helper()
	size := dt.Size()
	for i := 0; i < len(got); i += size {
		g, w := got[i:i+size], want[i:i+size]
		if bytes.Equal(g, w) || (math.IsNaN(numeric.Get(dt, g, 0)) && math.IsNaN(numeric.Get(dt, w, 0))) {
			continue
		}
		var in [][]byte
		for _, s := range srcs {
			in = append(in, s[i:i+size])
		}
		t.Fatalf("%s %s%s element %d: generated %x, portable %x, inputs %x", dt, op, what, i/size, g, w, in)
	}
}
