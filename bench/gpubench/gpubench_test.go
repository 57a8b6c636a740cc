package gpubench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/numeric"
)

func TestAlgBandwidthAndReplays(t *testing.T) {
	if got := AlgBandwidthGBps(2e9, 2); got != 1 {
		t.Errorf("algbw: %v, want 1", got)
	}
	for _, c := range []struct {
		ms   float64
		want int
	}{{0.1, 200}, {10, 5}, {0.001, 1000}, {0, 1000}, {3, 7}} {
		if got := Replays(c.ms, 20, 5, 1000); got != c.want {
			t.Errorf("Replays(%v ms) = %d, want %d", c.ms, got, c.want)
		}
	}
}

func TestShapeFor(t *testing.T) {
	sh, ok := ShapeFor(coll.AllReduce, "bf16", 1024, 4)
	if !ok || sh.Count != 512 || sh.InBytes != 1024 || sh.OutBytes != 1024 || sh.Bytes != 1024 {
		t.Errorf("allreduce: %+v %v", sh, ok)
	}
	sh, ok = ShapeFor(coll.ReduceScatter, "f32", 1024, 4)
	if !ok || sh.Count != 64 || sh.InBytes != 1024 || sh.OutBytes != 256 {
		t.Errorf("reduce_scatter: %+v %v", sh, ok)
	}
	sh, ok = ShapeFor(coll.AllGather, "e4m3", 1024, 4)
	if !ok || sh.Count != 256 || sh.InBytes != 256 || sh.OutBytes != 1024 {
		t.Errorf("allgather: %+v %v", sh, ok)
	}
	// World 3 rounds down to whole elements per rank.
	sh, ok = ShapeFor(coll.AllGather, "bf16", 1024, 3)
	if !ok || sh.Count != 170 || sh.Bytes != 1020 {
		t.Errorf("allgather w3: %+v %v", sh, ok)
	}
	if _, ok := ShapeFor(coll.ReduceScatter, "f32", 8, 4); ok {
		t.Error("8 bytes of f32 over 4 ranks should not fit")
	}
	if _, ok := ShapeFor(coll.AllReduce, "nope", 1024, 4); ok {
		t.Error("unknown dtype should not fit")
	}
}

func TestAwkward(t *testing.T) {
	for _, c := range []struct {
		coll          coll.Collective
		dt            coll.DType
		bytes         int64
		world         int
		count         int
		full, in, out int64
	}{
		// All-reduce: one element less in all.
		{coll.AllReduce, "bf16", 1024, 2, 511, 1022, 1022, 1022},
		// The others: one element less per rank.
		{coll.AllGather, "bf16", 1024, 4, 127, 1016, 254, 1016},
		{coll.ReduceScatter, "f32", 1024, 4, 63, 1008, 1008, 252},
		// World 3: 4 MiB of bf16 is 699050 elements per rank.
		{coll.AllGather, "bf16", 4 << 20, 3, 699049, 4194294, 1398098, 4194294},
	} {
		sh, _ := ShapeFor(c.coll, c.dt, c.bytes, c.world)
		aw, ok := bench.Awkward(c.coll, c.dt, sh, c.world, bench.AwkwardBoth)
		if !ok || aw.Count != c.count || aw.Bytes != c.full || aw.InBytes != c.in || aw.OutBytes != c.out || aw.Offset != int64(c.dt.Size()) || !aw.Awkward {
			t.Errorf("%s %s %d at world %d: %+v %v, want count %d, bytes %d/%d/%d, offset %d", c.coll, c.dt, c.bytes, c.world, aw, ok, c.count, c.full, c.in, c.out, c.dt.Size())
		}
		// One departure alone: the count (aligned pointers), or the
		// pointers (the regular count).
		if cnt, ok := bench.Awkward(c.coll, c.dt, sh, c.world, bench.AwkwardCount); !ok || cnt.Count != c.count || cnt.Bytes != c.full || cnt.Offset != 0 || !cnt.Awkward {
			t.Errorf("%s %s %d at world %d, count only: %+v %v", c.coll, c.dt, c.bytes, c.world, cnt, ok)
		}
		if off, ok := bench.Awkward(c.coll, c.dt, sh, c.world, bench.AwkwardOffset); !ok || off.Count != sh.Count || off.Bytes != sh.Bytes || off.Offset != int64(c.dt.Size()) || !off.Awkward {
			t.Errorf("%s %s %d at world %d, offset only: %+v %v", c.coll, c.dt, c.bytes, c.world, off, ok)
		}
		if _, ok := bench.Awkward(c.coll, c.dt, sh, c.world, bench.AwkwardNone); ok {
			t.Errorf("AwkwardNone made a twin")
		}
	}
	sh, _ := ShapeFor(coll.AllGather, "f32", 16, 4)
	if aw, ok := bench.Awkward(coll.AllGather, "f32", sh, 4, bench.AwkwardBoth); ok {
		t.Errorf("one element per rank has no awkward twin, got %+v", aw)
	}
	if aw, ok := bench.Awkward(coll.AllGather, "f32", sh, 4, bench.AwkwardOffset); !ok || aw.Count != 1 || aw.Offset != 4 {
		t.Errorf("one element per rank has a twin with its pointers off: %+v %v", aw, ok)
	}
	for _, name := range []string{"both", "count", "offset"} {
		if k, err := bench.ParseAwkward(name); err != nil || k.String() != name {
			t.Errorf("ParseAwkward(%q) = %v, %v", name, k, err)
		}
	}
	if _, err := bench.ParseAwkward("sideways"); err == nil {
		t.Error(`ParseAwkward("sideways") accepted`)
	}
}

func names(vs []Variant) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Name())
	}
	return out
}

func TestVariants(t *testing.T) {
	lib := collectives.Library
	vs, _, err := Variants(lib, coll.AllReduce, "bf16", "sum", 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := names(vs)
	if len(got) < 3 || got[len(got)-2] != "auto" || got[len(got)-1] != "nccl" || !slices.Contains(got, "oneshot") || !slices.Contains(got, "twoshot") {
		t.Errorf("allreduce bf16 sum w4 variants = %v, want the generated algorithms, auto, nccl", got)
	}
	for _, v := range vs {
		if (v.Name() == "auto") != (v.Algorithm == coll.Auto) || (v.Name() == "nccl") != (v.Algorithm == coll.NCCL) {
			t.Errorf("variant %+v: wrong Algorithm", v)
		}
		if v.Custom() != (v.Name() != "auto" && v.Name() != "nccl") {
			t.Errorf("variant %+v: Custom() = %v", v, v.Custom())
		}
	}
	if all, _, _ := Variants(lib, coll.AllReduce, "bf16", "sum", 4, []string{"all"}); !reflect.DeepEqual(names(all), got) {
		t.Errorf("\"all\" = %v, want %v", names(all), got)
	}
	vs, _, err = Variants(lib, coll.AllReduce, "bf16", "sum", 4, []string{"nccl,auto", "oneshot", "auto"})
	if err != nil || !reflect.DeepEqual(names(vs), []string{"nccl", "auto", "oneshot"}) {
		t.Errorf("requested order: %v, %v", names(vs), err)
	}
	if _, _, err := Variants(lib, coll.AllReduce, "bf16", "sum", 4, []string{"ring"}); err == nil || !strings.Contains(err.Error(), "oneshot") {
		t.Errorf("unknown algorithm: %v, want an error listing what exists", err)
	}
	// An algorithm the collective has no kernel for is left out and named,
	// so one sweep can name several collectives' algorithms; if nothing
	// requested is left, that is an error naming what exists.
	vs, missing, err := Variants(lib, coll.AllGather, "bf16", "", 2, []string{"twoshot,oneshot,auto"})
	if err != nil || !reflect.DeepEqual(names(vs), []string{"oneshot", "auto"}) || !reflect.DeepEqual(missing, []string{"twoshot"}) {
		t.Errorf("allgather with twoshot requested: %v, missing %v, %v; want oneshot, auto and twoshot missing", names(vs), missing, err)
	}
	if _, missing, err := Variants(lib, coll.AllGather, "bf16", "", 2, []string{"twoshot,hcm"}); err == nil || !strings.Contains(err.Error(), "oneshot_ll") || len(missing) != 2 {
		t.Errorf("allgather with only twoshot and hcm: missing %v, %v; want an error listing what exists", missing, err)
	}
	// All-gather ignores the op; fp8 has copy kernels.
	vs, _, err = Variants(lib, coll.AllGather, "e4m3", "sum", 2, nil)
	if err != nil || !slices.Contains(names(vs), "oneshot") {
		t.Errorf("allgather e4m3: %v, %v", names(vs), err)
	}
	// No kernels for this world: only auto and nccl.
	vs, _, _ = Variants(lib, coll.AllReduce, "bf16", "sum", 5, nil)
	if !reflect.DeepEqual(names(vs), []string{"auto", "nccl"}) {
		t.Errorf("world 5: %v", names(vs))
	}
}

// TestNCCLVariants: nccl_reg and nccl_win are NCCL on buffers of their
// own kind, run only when named.
func TestNCCLVariants(t *testing.T) {
	lib := collectives.Library
	vs, _, err := Variants(lib, coll.AllReduce, "bf16", "sum", 2, []string{"auto,nccl,nccl_reg,nccl_win,nccl_reg"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Variant{{Algorithm: coll.Auto}, {Algorithm: coll.NCCL}, {Algorithm: coll.NCCL, Buffers: RegisteredBuffers}, {Algorithm: coll.NCCL, Buffers: WindowBuffers}}
	if !reflect.DeepEqual(vs, want) || !reflect.DeepEqual(names(vs), []string{"auto", "nccl", "nccl_reg", "nccl_win"}) {
		t.Errorf("variants %+v (%v), want %+v", vs, names(vs), want)
	}
	all, _, _ := Variants(lib, coll.AllReduce, "bf16", "sum", 2, nil)
	for _, v := range all {
		if v.Buffers != PlainBuffers {
			t.Errorf("the default list has %s", v.Name())
		}
	}
	if _, _, err := Variants(lib, coll.AllReduce, "bf16", "sum", 2, []string{"nccl_bogus"}); err == nil || !strings.Contains(err.Error(), "nccl_reg, nccl_win") {
		t.Errorf("unknown name: %v, want the list to name nccl_reg and nccl_win", err)
	}
	if r := SkipReason(want[3], 1, 1, 1, errors.New("no libnccl")); !strings.Contains(r, "nccl_win unavailable") {
		t.Errorf("skip reason %q", r)
	}
}

func TestSkipReason(t *testing.T) {
	one := Variant{Algorithm: coll.OneShot}
	if r := SkipReason(one, 1<<20, 1<<20, 1<<20, nil); r != "" {
		t.Errorf("at the staging size: %q", r)
	}
	if r := SkipReason(one, 2<<20, 2<<20, 1<<20, nil); !strings.Contains(r, "staging") {
		t.Errorf("above staging: %q", r)
	}
	ll := Variant{Algorithm: coll.OneShotLL}
	if r := SkipReason(ll, 1<<20, 8<<20, 4<<20, nil); !strings.Contains(r, "1MiB (needing 8MiB of inbox) above its 4MiB staging buffer") {
		t.Errorf("LL above staging: %q", r)
	}
	if r := SkipReason(Variant{Algorithm: coll.Auto}, 1<<30, 1<<30, 1<<20, nil); r != "" {
		t.Errorf("auto never skips: %q", r)
	}
	nc := Variant{Algorithm: coll.NCCL}
	if r := SkipReason(nc, 1<<30, 1<<30, 1<<20, nil); r != "" {
		t.Errorf("nccl available: %q", r)
	}
	if r := SkipReason(nc, 1, 1, 1<<20, errors.New("no libnccl")); !strings.Contains(r, "no libnccl") {
		t.Errorf("nccl unavailable: %q", r)
	}
}

// TestRefusalReason: a forced algorithm the communicator refuses for a
// call (typed ErrInvalidArgument or ErrUnsupported, as Explain returns
// them) is skipped with the communicator's reason; auto's refusals and
// other errors are failures, and a call Explain accepts is measured.
func TestRefusalReason(t *testing.T) {
	two := Variant{Algorithm: coll.TwoShot}
	refused := fmt.Errorf("%w: comm: allreduce with algorithm twoshot refused: 268435456 bytes exceed the 8388608-byte scratch area", comm.ErrInvalidArgument)
	if r := RefusalReason(two, refused, nil); !strings.Contains(r, "scratch area") {
		t.Errorf("refused forced twoshot: %q", r)
	}
	noKernel := fmt.Errorf("%w: comm: allreduce with algorithm hcm refused: the library has no kernel", comm.ErrUnsupported)
	if r := RefusalReason(Variant{Algorithm: coll.HCM}, noKernel, nil); r == "" {
		t.Error("a forced algorithm without a kernel is not skipped")
	}
	if r := RefusalReason(Variant{Algorithm: coll.Auto}, refused, nil); r != "" {
		t.Errorf("auto skipped: %q", r)
	}
	if r := RefusalReason(two, fmt.Errorf("%w: peer 1 never arrived", comm.ErrTimeout), nil); r != "" {
		t.Errorf("a timeout skipped: %q", r)
	}
	if r := RefusalReason(two, nil, nil); r != "" {
		t.Errorf("an accepted call skipped: %q", r)
	}
}

func TestStagingFor(t *testing.T) {
	lib := collectives.Library
	sizes := []int64{1 << 10, 256 << 20}
	// Every all-reduce kernel runs in rounds (barrier kernels, and the push
	// ones with PushRounds): forcing any of them to 256 MiB keeps comm's
	// default sizing, which is what users get.
	all, _, _ := Variants(lib, coll.AllReduce, "bf16", "sum", 4, nil)
	if s := StagingFor(lib, coll.AllReduce, 4, sizes, all, 0); s != 0 {
		t.Errorf("all-reduce, every algorithm forced up to 256MiB: staging %d, want 0 (the default)", s)
	}
	// A reduce-scatter's LL push one-shot runs in one round (the LL128 one
	// in rounds): its inbox must hold 256 MiB's chunks, more than the
	// rules' floor.
	rs, _, _ := Variants(lib, coll.ReduceScatter, "bf16", "sum", 4, nil)
	want := max(lib.SlotBound(coll.ReduceScatter, coll.OneShotLL128, 4, 256<<20), lib.SlotBound(coll.ReduceScatter, coll.OneShotLL, 4, 256<<20))
	if s := StagingFor(lib, coll.ReduceScatter, 4, sizes, rs, 0); s != want || want < 256<<20 {
		t.Errorf("reduce-scatter, every algorithm forced up to 256MiB: staging %d, want the LL inbox %d", s, want)
	}
	if s := StagingFor(lib, coll.ReduceScatter, 4, sizes, rs, 64<<20); s != 64<<20 {
		t.Errorf("limit: staging %d", s)
	}
	// Up to the rules' own bounds (one-shot LL to 128 KiB) the default
	// holds it; above, the largest need (at least the rules').
	if s := StagingFor(lib, coll.ReduceScatter, 4, []int64{1 << 10, 128 << 10}, rs, 0); s != 0 {
		t.Errorf("reduce-scatter forced up to 128KiB: staging %d, want 0", s)
	}
	if s := StagingFor(lib, coll.ReduceScatter, 4, []int64{1 << 10, 1 << 20}, rs, 0); s < 1<<20 {
		t.Errorf("reduce-scatter forced up to 1MiB: staging %d, want the LL inbox or the rules' need", s)
	}
	// Without forced algorithms the default sizing serves the rules.
	auto := []Variant{{Algorithm: coll.Auto}, {Algorithm: coll.NCCL}}
	if s := StagingFor(lib, coll.ReduceScatter, 4, sizes, auto, 0); s != 0 {
		t.Errorf("auto only: staging %d, want 0", s)
	}
}

func TestPlan(t *testing.T) {
	cfg := Config{Library: collectives.Library, WorldSize: 4, Collective: coll.ReduceScatter, DType: "f32", Op: "sum",
		Sizes: []int64{8, 16, 1024, 1025}}
	var log bytes.Buffer
	cfg.Log = &log
	p, err := NewPlan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 8 bytes: under one element per rank; 1025 rounds down to 1024.
	if len(p.Shapes) != 2 || p.Shapes[0].Bytes != 16 || p.Shapes[1].Bytes != 1024 {
		t.Errorf("shapes %+v", p.Shapes)
	}
	if !strings.Contains(log.String(), "8B") {
		t.Errorf("no note about the skipped size: %q", log.String())
	}
	// Awkward: every size followed by its twin, except the one that has
	// only one element per rank.
	for _, c := range []struct {
		kind bench.AwkwardKind
		want string
	}{
		{bench.AwkwardBoth, "16+0 1024+0 1008+4*"},
		{bench.AwkwardCount, "16+0 1024+0 1008+0*"},
		{bench.AwkwardOffset, "16+0 16+4* 1024+0 1024+4*"},
	} {
		cfg.Awkward = c.kind
		if p, err = NewPlan(cfg); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, sh := range p.Shapes {
			s := fmt.Sprintf("%d+%d", sh.Bytes, sh.Offset)
			if sh.Awkward {
				s += "*"
			}
			got = append(got, s)
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("awkward shapes (%s) %s, want %s", c.kind, strings.Join(got, " "), c.want)
		}
	}
	for _, bad := range []Config{
		{WorldSize: 4, Collective: coll.AllReduce, DType: "f32", Op: "sum", Sizes: []int64{1}},
		{Library: collectives.Library, WorldSize: 4, Collective: "broadcast", DType: "f32", Op: "sum", Sizes: []int64{1024}},
		{Library: collectives.Library, WorldSize: 4, Collective: coll.AllReduce, DType: "e4m3", Op: "sum", Sizes: []int64{1024}},
		{Library: collectives.Library, WorldSize: 4, Collective: coll.AllReduce, DType: "f32", Op: "avg", Sizes: []int64{1024}},
		{Library: collectives.Library, WorldSize: 4, Collective: coll.AllReduce, DType: "f32", Op: "sum"},
		{Library: collectives.Library, WorldSize: 2, Devices: []int{0}, Collective: coll.AllReduce, DType: "f32", Op: "sum", Sizes: []int64{1024}},
	} {
		if _, err := NewPlan(bad); err == nil {
			t.Errorf("NewPlan(%+v): want an error", bad)
		}
	}
}

func TestFillDerived(t *testing.T) {
	ms := []Measurement{
		{Collective: coll.AllReduce, World: 4, Bytes: 1e6, Variant: "oneshot", LatencyUS: 10},
		{Collective: coll.AllReduce, World: 4, Bytes: 1e6, Variant: "auto", LatencyUS: 20},
		{Collective: coll.AllReduce, World: 4, Bytes: 1e6, Variant: "nccl", LatencyUS: 30},
		{Collective: coll.AllReduce, World: 4, Bytes: 1e6, Variant: "twoshot", Skipped: "too big"},
	}
	fillDerived(ms)
	if ms[0].VsNCCL != 3 || ms[1].VsNCCL != 1.5 || ms[2].VsNCCL != 1 || ms[3].VsNCCL != 0 {
		t.Errorf("ratios %v %v %v %v", ms[0].VsNCCL, ms[1].VsNCCL, ms[2].VsNCCL, ms[3].VsNCCL)
	}
	// 1 MB in 10 us = 100 GB/s alg, 150 GB/s bus at W=4.
	if math.Abs(ms[0].AlgGBps-100) > 1e-9 || math.Abs(ms[0].BusGBps-150) > 1e-9 {
		t.Errorf("bandwidth alg %v bus %v", ms[0].AlgGBps, ms[0].BusGBps)
	}
	// A row whose --check failed is no reference and gets no ratio: an
	// NCCL that computed the wrong answer once gave every row of its size
	// a "vs nccl" (the JSON's ratio against a row the JSON leaves out).
	bad := []Measurement{
		{Collective: coll.AllReduce, World: 4, Bytes: 1e6, Variant: "oneshot", LatencyUS: 10, Check: "ok"},
		{Collective: coll.AllReduce, World: 4, Bytes: 1e6, Variant: "twoshot", LatencyUS: 5, Check: "FAIL: rank 0: element 1"},
		{Collective: coll.AllReduce, World: 4, Bytes: 1e6, Variant: "nccl", LatencyUS: 30, Check: "FAIL: rank 2: element 7"},
		{Collective: coll.AllReduce, World: 4, Bytes: 2e6, Variant: "twoshot", LatencyUS: 5, Check: "FAIL: rank 0: element 1"},
		{Collective: coll.AllReduce, World: 4, Bytes: 2e6, Variant: "nccl", LatencyUS: 30, Check: "ok"},
	}
	fillDerived(bad)
	for i, m := range bad {
		if m.VsNCCL != 0 && i != 4 {
			t.Errorf("%s at %d B (check %q): vs nccl %v, want none", m.Variant, m.Bytes, m.Check, m.VsNCCL)
		}
	}
	if bad[4].VsNCCL != 1 {
		t.Errorf("a valid nccl row's own ratio %v, want 1", bad[4].VsNCCL)
	}
}

func TestFillAndVerify(t *testing.T) {
	for _, dt := range []coll.DType{coll.BF16, coll.F32, coll.F16, coll.E4M3} {
		b := make([]byte, PatternBytes+4096)
		FillInput(dt, b, seed0, 1)
		es := dt.Size()
		for i := 0; i < len(b)/es; i++ {
			if bytes.Count(b[i*es:(i+1)*es], []byte{0}) == es {
				t.Fatalf("%s: element %d is zero", dt, i)
			}
		}
		// A shorter buffer's data is a prefix of a longer one's.
		small := make([]byte, 4096)
		FillInput(dt, small, seed0, 1)
		if !bytes.Equal(small, b[:4096]) {
			t.Errorf("%s: the fill is not prefix-consistent", dt)
		}
		// The second block is the first rotated by one element.
		if !bytes.Equal(b[PatternBytes:], b[es:4096+es]) || bytes.Equal(b[PatternBytes:], b[:4096]) {
			t.Errorf("%s: the second PatternBytes block is not the first rotated by one element", dt)
		}
	}
	const world = 3
	for _, c := range []struct {
		coll coll.Collective
		dt   coll.DType
		op   coll.Op
	}{
		{coll.AllReduce, "bf16", "sum"}, {coll.AllReduce, "f32", "max"},
		{coll.ReduceScatter, "f16", "sum"}, {coll.AllGather, "e5m2", ""}, {coll.AllGather, "bf16", ""},
	} {
		// Crosses the pattern period, so windows split.
		sh, _ := ShapeFor(c.coll, c.dt, PatternBytes*world+6*1024, world)
		ins := make([][]byte, world)
		for r := range ins {
			ins[r] = make([]byte, sh.InBytes)
			FillInput(c.dt, ins[r], seed0, r)
		}
		for rank := 0; rank < world; rank++ {
			got := make([]byte, sh.OutBytes)
			switch c.coll {
			case coll.AllGather:
				for r := range ins {
					copy(got[int64(r)*sh.InBytes:], ins[r])
				}
			default:
				base := int64(0)
				if c.coll == coll.ReduceScatter {
					base = int64(rank) * sh.OutBytes
				}
				srcs := make([][]byte, world)
				for r := range ins {
					srcs[r] = ins[r][base : base+sh.OutBytes]
				}
				red, err := numeric.Reducer(c.dt, c.op)
				if err != nil {
					t.Fatal(err)
				}
				red(got, srcs)
			}
			if err := Verify(c.coll, c.dt, c.op, world, rank, sh, seed0, got, false); err != nil {
				t.Errorf("%s %s %s rank %d: correct output rejected: %v", c.coll, c.dt, c.op, rank, err)
			}
			bad := append([]byte(nil), got...)
			bad[len(bad)-1] ^= 0x40
			if err := Verify(c.coll, c.dt, c.op, world, rank, sh, seed0, bad, false); err == nil {
				t.Errorf("%s %s %s rank %d: corrupted output accepted", c.coll, c.dt, c.op, rank)
			}
			unwritten := append([]byte(nil), got...)
			for i := PatternBytes / 2; i < PatternBytes/2+64; i++ {
				unwritten[i] = 0xff
			}
			if err := Verify(c.coll, c.dt, c.op, world, rank, sh, seed0, unwritten, false); err == nil {
				t.Errorf("%s %s %s rank %d: unwritten output accepted", c.coll, c.dt, c.op, rank)
			}
		}
	}
}

func TestLocalPeers(t *testing.T) {
	const world, rounds = 4, 200
	ps := LocalPeers(world)
	var wg sync.WaitGroup
	errs := make(chan error, world)
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				all, err := ps[r].AllGather(context.Background(), []byte{byte(r), byte(i)})
				if err != nil {
					errs <- err
					return
				}
				for q, b := range all {
					if len(b) != 2 || b[0] != byte(q) || b[1] != byte(i) {
						errs <- errors.New("rank saw another round's blob")
						return
					}
				}
			}
			var e error
			if r == 2 {
				e = errors.New("boom")
			}
			if err := agree(context.Background(), ps[r], e); err == nil || !strings.Contains(err.Error(), "rank 2: boom") {
				errs <- errors.New("agree did not report rank 2's error: " + errString(err))
			}
		}(r)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A rank alone gives up with its context.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := LocalPeers(2)[0].AllGather(ctx, nil); err == nil {
		t.Error("a lone rank's AllGather returned without its peer")
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestRunGPU: without two GPUs, Run fails cleanly (no hang, no panic); with
// enough GPUs it runs a tiny sweep.
func TestRunGPU(t *testing.T) {
	n, err := cuda.DeviceCount()
	cfg := Config{Library: collectives.Library, WorldSize: 2, Collective: coll.AllReduce, DType: "bf16", Op: "sum",
		Sizes: []int64{4 << 10, 1 << 20}, Check: true, Awkward: bench.AwkwardBoth, Replays: 5}
	if err != nil || n < 2 {
		if _, rerr := Run(context.Background(), cfg); rerr == nil {
			t.Fatal("Run without two GPUs succeeded")
		}
		t.Skipf("needs 2 GPUs (have %d, %v)", n, err)
	}
	ms, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		t.Logf("%+v", m)
		if m.Skipped == "" && (!m.Measured() || m.Check != "ok") {
			t.Errorf("%s at %d: not measured or check failed: %+v", m.Variant, m.Bytes, m)
		}
	}
}

// TestVerifyMisplacedBlock: --check catches data moved by a whole number
// of pattern blocks, as a kernel running in rounds would misplace it with
// a wrong round offset (its windows, 8 MiB by default, are whole blocks).
// The inputs repeated one 4 MiB block exactly, so the output of such a
// kernel equalled the right one and passed.
func TestVerifyMisplacedBlock(t *testing.T) {
	const world = 2
	for _, c := range []struct {
		coll coll.Collective
		dt   coll.DType
		op   coll.Op
	}{
		{coll.AllReduce, "bf16", "sum"}, {coll.ReduceScatter, "f32", "max"}, {coll.AllGather, "bf16", ""}, {coll.AllGather, "e4m3", ""},
	} {
		sh, _ := ShapeFor(c.coll, c.dt, 6*PatternBytes, world)
		ins := make([][]byte, world)
		for r := range ins {
			ins[r] = make([]byte, sh.InBytes)
			FillInput(c.dt, ins[r], seed0, r)
		}
		const rank = 1
		got := make([]byte, sh.OutBytes)
		if c.coll == coll.AllGather {
			for r := range ins {
				copy(got[int64(r)*sh.InBytes:], ins[r])
			}
		} else {
			base := int64(0)
			if c.coll == coll.ReduceScatter {
				base = rank * sh.OutBytes
			}
			srcs := make([][]byte, world)
			for r := range ins {
				srcs[r] = ins[r][base : base+sh.OutBytes]
			}
			red, err := numeric.Reducer(c.dt, c.op)
			if err != nil {
				t.Fatal(err)
			}
			red(got, srcs)
		}
		if err := Verify(c.coll, c.dt, c.op, world, rank, sh, seed0, got, false); err != nil {
			t.Fatalf("%s %s: correct output rejected: %v", c.coll, c.dt, err)
		}
		// The second block written with the first block's result.
		bad := append([]byte(nil), got...)
		copy(bad[PatternBytes:2*PatternBytes], got[:PatternBytes])
		if err := Verify(c.coll, c.dt, c.op, world, rank, sh, seed0, bad, false); err == nil {
			t.Errorf("%s %s: output with a block moved by %d bytes accepted", c.coll, c.dt, PatternBytes)
		}
	}
}

// TestRefusalReasonAutoWithoutNCCL: where NCCL is unavailable, auto's
// refusal of a size the rules give to NCCL is skipped with the reason;
// with NCCL available, or auto's other errors, it is not (a forced
// algorithm's refusals: TestRefusalReason).
func TestRefusalReasonAutoWithoutNCCL(t *testing.T) {
	auto := Variant{Algorithm: coll.Auto}
	off := fmt.Errorf("%w: comm: allreduce of 268435456 bytes (bf16) selects nccl, but NCCL is unavailable on rank 0: ranks share a GPU", comm.ErrUnsupported)
	unavailable := errors.New("NCCL is unavailable on rank 0: ranks share a GPU")
	if r := RefusalReason(auto, off, unavailable); !strings.Contains(r, "selects nccl") {
		t.Errorf("auto at an NCCL size: %q", r)
	}
	if r := RefusalReason(auto, off, nil); r != "" {
		t.Errorf("NCCL available: %q", r)
	}
	if r := RefusalReason(auto, fmt.Errorf("%w: peer 1 never arrived", comm.ErrTimeout), unavailable); r != "" {
		t.Errorf("auto's timeout skipped: %q", r)
	}
	if r := RefusalReason(auto, nil, unavailable); r != "" {
		t.Errorf("auto accepted: %q", r)
	}
}
