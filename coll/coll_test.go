package coll

import (
	"errors"
	"math"
	"testing"
)

func TestParseRoundTrips(t *testing.T) {
	for _, c := range Collectives() {
		if got, err := ParseCollective(c.String()); err != nil || got != c {
			t.Errorf("ParseCollective(%q) = %q, %v", c, got, err)
		}
	}
	for _, d := range DTypes() {
		if got, err := ParseDType(d.String()); err != nil || got != d || !d.Valid() {
			t.Errorf("ParseDType(%q) = %q, %v", d, got, err)
		}
	}
	for _, o := range Ops() {
		if got, err := ParseOp(o.String()); err != nil || got != o {
			t.Errorf("ParseOp(%q) = %q, %v", o, got, err)
		}
	}
	for _, a := range append([]Algorithm{Auto, NCCL, Hierarchical}, Algorithms()...) {
		if got, err := ParseAlgorithm(a.String()); err != nil || got != a || !a.Valid() {
			t.Errorf("ParseAlgorithm(%q) = %q, %v", a, got, err)
		}
	}
	if a, err := ParseAlgorithm(""); err != nil || a != Auto {
		t.Errorf(`ParseAlgorithm("") = %q, %v`, a, err)
	}
}

func TestParseRejectsTypos(t *testing.T) {
	for _, err := range []error{
		func() error { _, err := ParseDType("bf61"); return err }(),
		func() error { _, err := ParseOp("add"); return err }(),
		func() error { _, err := ParseCollective("all_reduce"); return err }(),
		func() error { _, err := ParseAlgorithm("oneshot_LL"); return err }(),
	} {
		if !errors.Is(err, ErrUnknown) {
			t.Errorf("error %v does not wrap ErrUnknown", err)
		}
	}
	if DType("bf61").Valid() || Op("add").Valid() || Collective("x").Valid() || Algorithm("x").Valid() || Protocol("x").Valid() {
		t.Error("a typo is Valid")
	}
}

func TestNCCLValuesMatchNCCLHeader(t *testing.T) {
	want := map[DType]int{I32: 2, I64: 4, F16: 6, F32: 7, F64: 8, BF16: 9, E4M3: 10, E5M2: 11}
	for _, d := range DTypes() {
		if v, ok := d.NCCL(); !ok || v != want[d] {
			t.Errorf("%s.NCCL() = %d, %v; want %d", d, v, ok, want[d])
		}
	}
	if v, ok := Max.NCCL(); !ok || v != 2 {
		t.Errorf("Max.NCCL() = %d, %v", v, ok)
	}
}

func TestBytesRefusesOverflow(t *testing.T) {
	cases := []struct {
		d       DType
		count   int64
		factors []int64
		want    int64
		ok      bool
	}{
		{F32, 10, nil, 40, true},
		{BF16, 8, []int64{4}, 64, true},
		{F32, 0, []int64{4}, 0, true},
		{F32, 1 << 62, nil, 0, false},
		{F32, math.MaxInt64, nil, 0, false},
		{F32, 1 << 60, []int64{4}, 0, false},
		{F32, 1 << 30, []int64{1 << 31}, 0, false},
		{F32, -1, nil, 0, false},
		{"x", 1, nil, 0, false},
	}
	for _, c := range cases {
		got, ok := c.d.Bytes(c.count, c.factors...)
		if got != c.want || ok != c.ok {
			t.Errorf("%s.Bytes(%d, %v) = %d, %v; want %d, %v", c.d, c.count, c.factors, got, ok, c.want, c.ok)
		}
	}
}

func TestProtocols(t *testing.T) {
	if Barrier.Push() || !LL.Push() || !LL128.Push() || Barrier.String() != "barrier" {
		t.Error("protocol predicates are wrong")
	}
}

func TestSizesAndOrder(t *testing.T) {
	for _, d := range DTypes() {
		if d.Size() == 0 {
			t.Errorf("%s has no size", d)
		}
	}
	if F32.Size() != 4 || BF16.Size() != 2 || E4M3.Size() != 1 || I64.Size() != 8 || DType("x").Size() != 0 {
		t.Error("sizes")
	}
	if !E5M2.IsFloat8() || F16.IsFloat8() || I32.IsFloat() || !BF16.IsFloat() {
		t.Error("IsFloat8 or IsFloat")
	}
	if AllGather.Order() != 2 || Collective("x").Order() != 3 || !ReduceScatter.Reduces() || AllGather.Reduces() {
		t.Error("Order or Reduces")
	}
}

func TestTopologyKinds(t *testing.T) {
	for _, k := range TopologyKinds() {
		if got, err := ParseTopologyKind(k.String()); err != nil || got != k {
			t.Errorf("ParseTopologyKind(%q) = %q, %v", k, got, err)
		}
	}
	if _, err := ParseTopologyKind("torus"); !errors.Is(err, ErrUnknown) {
		t.Errorf("torus: %v", err)
	}
	if !NVLinkFull.IsGPU() || HostSHM.IsGPU() || TopologyKind("torus").IsGPU() {
		t.Error("IsGPU")
	}
}

func TestBytesDoesNotAllocate(t *testing.T) {
	if a := testing.AllocsPerRun(100, func() { BF16.Bytes(1<<20, 4) }); a != 0 {
		t.Errorf("Bytes allocates %v times per call", a)
	}
}
