package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// newTestGPU builds the pure state of a GPU communicator without a GPU.
func newTestGPU(t *testing.T, cfg Config) (*gpuComm, error) {
	t.Helper()
	if cfg.Library == nil {
		cfg.Library = collectives.Library
	}
	g, err := newGPUState(cfg, "test/", nil)
	if g != nil {
		g.dev = worldDevice{&fakeDevice{rank: cfg.Rank}, cfg.WorldSize} // no symmetric buffers: every call is staged
	}
	return g, err
}

// frontOf wraps a GPU state in a Communicator whose front end resolves
// calls against it (a fake device: only selection and refusals run).
func frontOf(g *gpuComm) *Communicator {
	return &Communicator{cfg: g.cfg, b: g, gpu: g}
}

func TestPickTopology(t *testing.T) {
	g, err := newTestGPU(t, Config{WorldSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	if g.topology != "nvswitch" {
		t.Errorf("auto topology %q, want nvswitch (nvlink_full preferred)", g.topology)
	}
	// Each protocol's area holds its rules' largest need within the 32 MiB
	// budget (DefaultStagingBudget, fitAreas): barrier kernels all-gather's
	// one-shot up to 16 MiB, capped at kernels.WindowBytes; LL all-reduce's
	// twoshot_ll up to 256 KiB (6 inbox places, 2(W-1), of 64 KiB payload,
	// 128 KiB as LL lines: 768 KiB); LL128 all-reduce's twoshot_ll128 up to
	// 8 MiB (capped at WindowBytes: it runs in rounds) and reduce-scatter's
	// one-shot LL128 up to 8 MiB, which has no rounds: 3 places of 2 MiB
	// payload in 17477 lines of 128 bytes, the area's floor. Two slots of
	// that plus the scratch buffer exceed 32 MiB, so the barrier and LL128
	// areas share the cut: LL128 keeps its floor, barrier gets the rest.
	floor := alignUp(3*17477*128, regionAlign)
	sig := g.signalBytes()
	var sum int64 // every protocol's area (a spec generating Lamport kernels adds one)
	for _, a := range g.area {
		sum += a
	}
	if g.area[coll.LL] != 6*128<<10 || g.area[coll.LL128] != floor || g.area[coll.Barrier] >= floor || g.slotBytes != sum {
		t.Errorf("areas %v (slot %d bytes), want ll 786432, ll128 %d (its floor), barrier below it", g.area, g.slotBytes, floor)
	}
	if total := 2*g.slotBytes + g.area[coll.Barrier] + sig; total > DefaultStagingBudget || total < DefaultStagingBudget-3*regionAlign {
		t.Errorf("region %d bytes, want just within the %d-byte budget", total, DefaultStagingBudget)
	}
	g, err = newTestGPU(t, Config{WorldSize: 4, Topology: "pcie", StagingBytes: 3000})
	if err != nil || g.topology != "pcie" || g.area[coll.Barrier] != 3072 || g.area[coll.LL128] != 3072 {
		t.Errorf("pcie with 3000 staging bytes: %q %v %v", g.topology, g.area, err)
	}
	g, err = newTestGPU(t, Config{WorldSize: 8})
	if err != nil || g.topology != "nvswitch" {
		t.Errorf("world 8 picks %q (%v), want nvswitch over hcm8", g.topology, err)
	}
	if _, err := newTestGPU(t, Config{WorldSize: 8, Topology: "hcm8"}); err != nil {
		t.Errorf("explicit hcm8: %v", err)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{WorldSize: 5, Topology: "nvswitch"}, `topology "nvswitch" does not exist for world size 5 in the library: no GPU topology generates it`},
		{Config{WorldSize: 2, Topology: "hcm8"}, `topology "hcm8" does not exist for world size 2`},
		{Config{WorldSize: 4, Topology: "nope"}, `topology "nope" does not exist`},
	} {
		if _, err := newTestGPU(t, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.cfg, err, c.want)
		}
	}
}

func TestChooseAndRefuse(t *testing.T) {
	g, err := newTestGPU(t, Config{WorldSize: 4, DisableNCCL: true})
	if err != nil {
		t.Fatal(err)
	}
	g.ncclErr = errors.New("NCCL is unavailable on rank 2: libnccl.so.2: cannot open shared object file")
	c := frontOf(g)
	for _, tc := range []struct {
		coll  coll.Collective
		dtype coll.DType
		bytes int64
		want  coll.Algorithm
	}{
		{coll.AllReduce, coll.BF16, 4 << 10, coll.OneShotLL},
		{coll.AllReduce, coll.BF16, 128 << 10, coll.TwoShotLL},
		{coll.AllReduce, coll.BF16, 1 << 20, coll.TwoShotLL128},
		{coll.ReduceScatter, coll.F16, 1 << 20, coll.OneShotLL128},
		{coll.AllReduce, coll.BF16, 4 << 20, coll.TwoShotLL128},
		{coll.AllReduce, coll.BF16, 9 << 20, coll.TwoShot},
		{coll.ReduceScatter, coll.F32, 4 << 20, coll.OneShotLL128},
		{coll.AllGather, coll.E4M3, 64 << 10, coll.OneShotLL},
	} {
		if got, err := c.Choose(tc.coll, tc.bytes, tc.dtype, coll.Sum); err != nil || got != tc.want {
			t.Errorf("%s %s %d bytes: %q %v, want %q", tc.coll, tc.dtype, tc.bytes, got, err, tc.want)
		}
	}
	// Above the rules' custom range the rules say nccl, which is missing:
	// an error naming why, never a silent substitute.
	if _, err := c.Choose(coll.AllReduce, 64<<20, coll.BF16, coll.Sum); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "selects nccl, but NCCL is unavailable on rank 2") {
		t.Errorf("64 MiB without NCCL: %v", err)
	}
	// A dtype the spec generated no kernel for goes to NCCL by the rules.
	if _, err := c.Choose(coll.AllReduce, 4<<10, coll.F64, coll.Sum); err == nil || !strings.Contains(err.Error(), "selects nccl") {
		t.Errorf("f64 without a kernel: %v", err)
	}
	// Choose checks its arguments (an unknown dtype used to give "twoshot").
	for _, bad := range []struct {
		coll  coll.Collective
		dtype coll.DType
		op    coll.Op
		bytes int64
	}{
		{coll.AllReduce, "f17", coll.Sum, 1 << 20},
		{coll.AllReduce, coll.BF16, "prod", 1 << 20},
		{coll.AllReduce, coll.E4M3, coll.Sum, 1 << 20},
		{"allreduce_v2", coll.BF16, coll.Sum, 1 << 20},
		{coll.AllReduce, coll.BF16, coll.Sum, -1},
	} {
		if a, err := c.Choose(bad.coll, bad.bytes, bad.dtype, bad.op); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Choose(%s, %d, %s, %s) = %q, %v; want ErrInvalidArgument", bad.coll, bad.bytes, bad.dtype, bad.op, a, err)
		}
	}
	refuse := []struct {
		n    int
		alg  coll.Algorithm
		kind error
		want string
	}{
		{16, coll.HCM, ErrUnsupported, "has no kernel hcm for bf16 sum at world size 4"},
		{16, coll.NCCL, ErrUnsupported, "algorithm nccl refused: NCCL is unavailable on rank 2"},
		{16, "threeshot", ErrInvalidArgument, `unknown name: algorithm "threeshot"`},
	}
	for _, r := range refuse {
		cl := &call{collective: coll.AllReduce, in: DeviceBuffer(0x1000), out: DeviceBuffer(0x2000), count: int64(r.n), dtype: coll.BF16, op: coll.Sum, o: Options{Algorithm: r.alg}}
		if err := c.resolve(cl); !errors.Is(err, r.kind) || !strings.Contains(err.Error(), r.want) {
			t.Errorf("forced %s: got %v, want %v %q", r.alg, err, r.kind, r.want)
		}
	}
	cl := &call{collective: coll.AllReduce, in: DeviceBuffer(0x1000), out: DeviceBuffer(0x2000), count: 512 << 10, dtype: coll.BF16, op: coll.Sum, o: Options{Algorithm: coll.TwoShot}}
	if err := c.resolve(cl); err != nil || cl.kernel == nil || cl.kernel.Name != "allreduce_twoshot_bf16_sum_w4" || cl.window != cl.chunk {
		t.Errorf("forced twoshot at 1 MiB: %v (kernel %v, window %d of a %d-element chunk)", err, cl.kernel, cl.window, cl.chunk)
	}
	// An all-reduce's push kernels run a message their inbox cannot hold
	// in rounds of equal windows that fit it.
	for _, alg := range []coll.Algorithm{coll.OneShotLL, coll.TwoShotLL128} {
		cl := &call{collective: coll.AllReduce, in: DeviceBuffer(0x1000), out: DeviceBuffer(0x2000), count: 8<<20 + 5, dtype: coll.BF16, op: coll.Sum, o: Options{Algorithm: alg}}
		if err := c.resolve(cl); err != nil || cl.window <= 0 || cl.window >= cl.chunk {
			t.Errorf("forced %s at 16 MiB: %v (window %d of a %d-element chunk), want rounds", alg, err, cl.window, cl.chunk)
			continue
		}
		proto := coll.Protocol(cl.kernel.Protocol)
		rounds := (cl.chunk + cl.window - 1) / cl.window
		need := cl.kernel.SlotBytes(0, cl.window*2)
		if cl.window%4 != 0 || need > c.gpu.area[proto] || pushWindow(c.gpu.area[proto], cl.kernel, cl.chunk, 2) != cl.window ||
			(cl.chunk+rounds-2)/(rounds-1) <= pushWindow(c.gpu.area[proto], cl.kernel, (cl.chunk+rounds-2)/(rounds-1), 2) {
			t.Errorf("forced %s at 16 MiB: window %d (%d rounds, inbox %d bytes) over a %d-byte area; want the fewest rounds of equal vectors that fit", alg, cl.window, rounds, need, c.gpu.area[proto])
		}
	}
	// A reduce-scatter's LL push one-shot has no rounds (the LL128 one
	// has): refused above its inbox, with the bytes it needs.
	rs := &call{collective: coll.ReduceScatter, in: DeviceBuffer(0x1000), out: DeviceBuffer(0x2000), count: 2 << 20, dtype: coll.BF16, op: coll.Sum, o: Options{Algorithm: coll.OneShotLL}}
	if err := c.resolve(rs); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "bytes of inbox (LL lines carry 8 payload bytes in 16), more than the staging buffer's 786432-byte ll area") {
		t.Errorf("forced reduce-scatter oneshot_ll at 8 MiB: %v, want a refusal naming the inbox", err)
	}
	// Larger than the staging area: rounds over windows that fit it.
	cl = &call{collective: coll.AllReduce, in: DeviceBuffer(0x1000), out: DeviceBuffer(0x2000), count: 100<<20 + 3, dtype: coll.BF16, op: coll.Sum, o: Options{Algorithm: coll.TwoShot}}
	area := c.gpu.area[coll.Barrier]
	if err := c.resolve(cl); err != nil || cl.window <= 0 || cl.window >= cl.chunk || cl.window%8 != 0 || 4*cl.window*2 > area || 4*(cl.window+8)*2 <= area {
		t.Errorf("forced twoshot at 200 MiB over a %d-byte area: %v (window %d of a %d-element chunk; want the most 8-element vectors of 4 chunks that fit)", area, err, cl.window, cl.chunk)
	}
}

func TestTimeoutErrorText(t *testing.T) {
	e := &TimeoutError{Kernel: "allreduce_oneshot_bf16_sum_w4", Rank: 1, Peer: 3, Barrier: 0, Block: 2}
	want := "comm: allreduce_oneshot_bf16_sum_w4 timed out: rank 1 waited for rank 3 at barrier 0 (block 2); the peer is dead, stalled or issuing a different collective"
	if e.Error() != want {
		t.Errorf("got %q", e.Error())
	}
	if !errors.Is(e, ErrTimeout) || !errors.Is(classify(e), ErrTimeout) {
		t.Error("a *TimeoutError does not match ErrTimeout")
	}
	e = &TimeoutError{Kernel: "allreduce_oneshot_ll_bf16_sum_w4", Rank: 1, Peer: 3, Barrier: 1, Block: 2, Data: true}
	want = "comm: allreduce_oneshot_ll_bf16_sum_w4 timed out: rank 1 waited for rank 3 for its data in phase 1 (block 2); the peer is dead, stalled or issuing a different collective"
	if e.Error() != want {
		t.Errorf("got %q", e.Error())
	}
}

// TestPackerRefusesBadLayouts checks that a kernel whose argument layout
// lacks a member, or whose arrays are shorter than the world size, is
// refused when the packer is built, not written out of bounds at launch.
func TestPackerRefusesBadLayouts(t *testing.T) {
	k, ok := collectives.Library.Kernel("allreduce", "oneshot", "f32", "sum", 4)
	if !ok {
		t.Fatal("no allreduce_oneshot_f32_sum_w4")
	}
	if _, err := newPacker(k, 0, 4); err != nil {
		t.Fatalf("generated layout: %v", err)
	}
	if _, err := newPacker(k, 0, 5); err == nil || !strings.Contains(err.Error(), "does not fit 5 values") {
		t.Errorf("world 5 in a w4 layout: %v", err)
	}
	bad := *k
	args := *k.Args
	args.Fields = args.Fields[1:] // no "input"
	bad.Args = &args
	if _, err := newPacker(&bad, 0, 4); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `no member "input"`) {
		t.Errorf("layout without input: %v", err)
	}
	bad.Args = nil
	if _, err := newPacker(&bad, 0, 4); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("no layout: %v", err)
	}
	// A kernel in a program shared by several ops needs the op member; one
	// from a package generated before programs (no Symbol) does without.
	bad = *k
	args = *k.Args
	args.Fields = slices.DeleteFunc(slices.Clone(args.Fields), func(f kernels.Field) bool { return f.Name == "op" })
	bad.Args = &args
	if _, err := newPacker(&bad, 0, 4); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `shared program allreduce_oneshot_f32_w4`) {
		t.Errorf("shared program without an op member: %v", err)
	}
	bad.Symbol = ""
	if _, err := newPacker(&bad, 0, 4); err != nil {
		t.Errorf("a kernel of an older package (no Symbol, no op member): %v", err)
	}
	bad = *k
	bad.Op = "prod"
	if _, err := newPacker(&bad, 0, 4); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `reduce op "prod"`) {
		t.Errorf("unknown op: %v", err)
	}
}

// TestPackerWritesTheOp checks that each reduce op's kernel tells the
// program it shares with the other ops which op to compute: the op member
// holds kernels.OpCode (the header's CG_OP_* value), and an all-gather's
// leaves it zero.
func TestPackerWritesTheOp(t *testing.T) {
	w := 2
	a := args{stage: make([]cuda.DevicePtr, w), scratch: make([]cuda.DevicePtr, w), signal: make([]cuda.DevicePtr, w)}
	symbol := ""
	for _, op := range coll.Ops() {
		k, ok := collectives.Library.Kernel(coll.AllReduce, coll.OneShotLL, coll.BF16, op, w)
		if !ok {
			t.Fatalf("no allreduce oneshot_ll bf16 %s w2", op)
		}
		if symbol != "" && k.Symbol != symbol {
			t.Errorf("%s runs %s, the other ops %s", k.Name, k.Symbol, symbol)
		}
		symbol = k.Symbol
		p, err := newPacker(k, 7, w)
		if err != nil {
			t.Fatal(err)
		}
		b := p.pack(make([]byte, 512), a)
		f, _ := k.Args.Lookup("op")
		if got := binary.LittleEndian.Uint32(b[f.Offset:]); got != uint32(kernels.OpCode(op)) || kernels.OpCode(op) < 0 {
			t.Errorf("%s: op member %d, want %d", k.Name, got, kernels.OpCode(op))
		}
	}
	if symbol != "allreduce_oneshot_ll_bf16_w2" {
		t.Errorf("the ops share %q, want allreduce_oneshot_ll_bf16_w2", symbol)
	}
	k, _ := collectives.Library.Kernel(coll.AllGather, coll.OneShot, coll.F16, "", w)
	p, err := newPacker(k, 7, w)
	if err != nil {
		t.Fatal(err)
	}
	b := p.pack(make([]byte, 512), a)
	f, _ := k.Args.Lookup("op")
	if got := binary.LittleEndian.Uint32(b[f.Offset:]); got != 0 || k.Symbol != "allgather_oneshot_u16_w2" {
		t.Errorf("%s: op member %d, symbol %s", k.Name, got, k.Symbol)
	}
}

// TestStagingBudget: with the shipped rules every world size's region (two
// stage slots, scratch, signal pad) fits DefaultStagingBudget; push areas
// with rounds are cut before the barrier area, so world 2 (no rule uses
// scratch) keeps its 8 MiB barrier window; a larger Config.StagingBudget
// gives the cut areas back; no area is below its rules' floor.
func TestStagingBudget(t *testing.T) {
	for _, w := range []int{2, 3, 4, 8} {
		g, err := newTestGPU(t, Config{WorldSize: w})
		if err != nil {
			t.Fatal(err)
		}
		total := 2*g.slotBytes + g.scratchBytes + g.signalBytes()
		if total > DefaultStagingBudget {
			t.Errorf("world %d: region %d bytes (areas %v, scratch %d), over the %d-byte budget", w, total, g.area, g.scratchBytes, DefaultStagingBudget)
		}
		for i := range g.lib.Selections {
			s := &g.lib.Selections[i]
			if s.Topology != g.topology || !slices.Contains(s.Worlds, w) {
				continue
			}
			for p, n := range g.lib.RulesSlotBounds(s, w) {
				if g.area[p] < n.Floor {
					t.Errorf("world %d: %s area %d below its floor %d", w, p, g.area[p], n.Floor)
				}
			}
		}
		// World 2's staged rules send every size to push kernels (LL up
		// to 64-256 KiB, then LL128, in rounds from 8 MiB): barrier kernels
		// keep the least area (forced ones run in 1 MiB windows) and LL128
		// gets the 8 MiB window.
		if w == 2 && (g.area[coll.Barrier] != minArea || g.scratchBytes != minArea || g.area[coll.LL128] != kernels.WindowBytes) {
			t.Errorf("world 2: areas %v, scratch %d; want a 1 MiB barrier area and scratch, the 8 MiB window for LL128", g.area, g.scratchBytes)
		}
		big, err := newTestGPU(t, Config{WorldSize: w, StagingBudget: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		for p, a := range big.area {
			if a < g.area[p] || a > kernels.WindowBytes+regionAlign && a > g.area[p] {
				t.Errorf("world %d, 1 GiB budget: %s area %d (default %d); want the rules' need, at most a window", w, p, a, g.area[p])
			}
		}
	}
}

// TestFakeHCMTopologyOnAllPairs: on GPUs where every pair has peer access
// (the fake machine, like an NVSwitch one), Config.Topology "hcm8" at world
// 8 makes the hybrid-cube-mesh rules and kernels the communicator's, with
// NCCL disabled: auto plans hcm up to the rules' 256 KiB and the hcm
// kernel can be forced, as tests/proof's TestProofHCMTopology expects on
// an 8-GPU machine.
func TestFakeHCMTopologyOnAllPairs(t *testing.T) {
	comms, _ := fakeComms(t, 8, Config{Topology: "hcm8", DisableNCCL: true})
	defer closeAll(t, comms)
	for _, c := range []struct {
		bytes int
		alg   coll.Algorithm
	}{{256 << 10, ""}, {1 << 10, ""}, {64 << 10, coll.HCM}} {
		p, err := comms[0].Explain(coll.AllReduce, DeviceBuffer(0x1000), DeviceBuffer(1<<40), c.bytes/2, coll.BF16, coll.Sum, Options{Algorithm: c.alg})
		if err != nil || p.Algorithm != coll.HCM {
			t.Errorf("%d bytes, algorithm %q: plan %+v, %v; want hcm", c.bytes, c.alg, p, err)
		}
	}
}

// TestClassifyRendezvousArgument: a rendezvous refusal of its arguments (a
// nil store, a rank out of range) reaches the caller as ErrInvalidArgument,
// not as a device error.
func TestClassifyRendezvousArgument(t *testing.T) {
	err := rendezvous.Barrier(context.Background(), rendezvous.NewMemStore(), "b", 3, 2)
	if got := classify(err); !errors.Is(got, ErrInvalidArgument) || errors.Is(got, ErrDevice) {
		t.Errorf("classify(%v) = %v, want ErrInvalidArgument", err, got)
	}
}
