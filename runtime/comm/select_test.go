package comm

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/kernels"
)

// newTestGPU builds the selection state of a GPU communicator without a GPU.
func newTestGPU(t *testing.T, cfg Config) (*gpuComm, error) {
	t.Helper()
	if cfg.Library == nil {
		cfg.Library = collectives.Library
	}
	g := &gpuComm{cfg: cfg, lib: cfg.Library, world: cfg.WorldSize, sels: map[coll.Collective]*kernels.Selection{}}
	return g, g.pickTopology()
}

func TestPickTopology(t *testing.T) {
	g, err := newTestGPU(t, Config{WorldSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	if g.topology != "nvswitch" {
		t.Errorf("auto topology %q, want nvswitch (nvlink_full preferred)", g.topology)
	}
	// Each protocol's area holds its rules' largest need: barrier kernels
	// all-gather's one-shot up to 16 MiB; LL all-reduce's twoshot_ll and
	// all-gather's oneshot_ll up to 256 KiB (16 inbox chunks of 64 KiB
	// payload, 128 KiB as LL lines: 2 MiB); LL128 all-reduce's twoshot_ll128
	// up to 8 MiB (16 chunks of 2 MiB payload in 17477 lines of 128 bytes).
	want := map[coll.Protocol]int64{"": 16 << 20, "ll": 2 << 20, "ll128": 16 * 17477 * 128}
	if !maps.Equal(g.area, want) || g.slotBytes != want[""]+want["ll"]+want["ll128"] {
		t.Errorf("areas %v (slot %d bytes), want %v", g.area, g.slotBytes, want)
	}
	g, err = newTestGPU(t, Config{WorldSize: 4, Topology: "pcie", StagingBytes: 3000})
	if err != nil || g.topology != "pcie" || g.area[""] != 3072 || g.area["ll128"] != 3072 {
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
		{Config{WorldSize: 5}, "no GPU topology of the library generates world size 5"},
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
	for _, c := range []struct {
		coll  coll.Collective
		dtype coll.DType
		bytes int64
		want  coll.Algorithm
	}{
		{"allreduce", "bf16", 4 << 10, "oneshot_ll"},
		{"allreduce", "bf16", 128 << 10, "twoshot_ll"},
		{"allreduce", "bf16", 1 << 20, "twoshot_ll128"},
		{"reduce_scatter", "f16", 1 << 20, "oneshot_ll128"},
		{"allreduce", "bf16", 4 << 20, "twoshot_ll128"},
		{"allreduce", "bf16", 9 << 20, "twoshot"},
		{"reduce_scatter", "f32", 4 << 20, "oneshot_ll128"},
		{"allgather", "e4m3", 64 << 10, "oneshot_ll"},
	} {
		got, err := g.choose(c.coll, c.bytes, c.dtype, "sum")
		if c.coll == "allgather" {
			got, err = g.choose(c.coll, c.bytes, c.dtype, "")
		}
		if err != nil || got != c.want {
			t.Errorf("%s %s %d bytes: %q %v, want %q", c.coll, c.dtype, c.bytes, got, err, c.want)
		}
	}
	// Above the rules' custom range the rules say nccl, which is missing:
	// an error naming why, never a silent substitute.
	if _, err := g.choose("allreduce", 64<<20, "bf16", "sum"); err == nil || !strings.Contains(err.Error(), "selects nccl, but NCCL is unavailable on rank 2") {
		t.Errorf("64 MiB without NCCL: %v", err)
	}
	// A dtype the spec generated no kernel for goes to NCCL by the rules.
	if _, err := g.choose("allreduce", 4<<10, "f64", "sum"); err == nil || !strings.Contains(err.Error(), "selects nccl") {
		t.Errorf("f64 without a kernel: %v", err)
	}
	refuse := []struct {
		c    call
		alg  coll.Algorithm
		want string
	}{
		{call{collective: "allreduce", dtype: "bf16", op: "sum"}, "hcm", "has no kernel hcm for bf16 sum at world size 4"},
		{call{collective: "allreduce", dtype: "bf16", op: "sum"}, "nccl", "algorithm nccl refused: NCCL is unavailable on rank 2"},
		{call{collective: "allreduce", dtype: "bf16", op: "sum", n: 16 << 20}, "twoshot", "exceed the 16777216-byte staging buffer"},
		{call{collective: "allreduce", dtype: "bf16", op: "sum", n: 2 << 20}, "oneshot_ll", "4194304 bytes need 33554432 bytes of inbox (LL lines carry 8 payload bytes in 16), more than the staging buffer's 2097152-byte ll area"},
		{call{collective: "allreduce", dtype: "bf16", op: "sum", n: 8 << 20}, "twoshot_ll128", "16777216 bytes need 71583744 bytes of inbox (LL128 lines carry 120 payload bytes in 128)"},
	}
	for _, r := range refuse {
		size := int64(r.c.dtype.Size())
		if err := g.checkForced(r.c, r.alg, r.c.n*size); err == nil || !strings.Contains(err.Error(), r.want) {
			t.Errorf("forced %s: got %v, want %q", r.alg, err, r.want)
		}
	}
	if err := g.checkForced(call{collective: "allreduce", dtype: "bf16", op: "sum"}, "twoshot", 1<<20); err != nil {
		t.Errorf("forced twoshot at 1 MiB: %v", err)
	}
}

func TestTimeoutErrorText(t *testing.T) {
	e := &TimeoutError{Kernel: "allreduce_oneshot_bf16_sum_w4", Rank: 1, Peer: 3, Barrier: 0, Block: 2}
	want := "comm: allreduce_oneshot_bf16_sum_w4 timed out: rank 1 waited for rank 3 at barrier 0 (block 2); the peer is dead, stalled or issuing a different collective"
	if e.Error() != want {
		t.Errorf("got %q", e.Error())
	}
	e = &TimeoutError{Kernel: "allreduce_oneshot_ll_bf16_sum_w4", Rank: 1, Peer: 3, Barrier: 1, Block: 2, Data: true}
	want = "comm: allreduce_oneshot_ll_bf16_sum_w4 timed out: rank 1 waited for rank 3 for its data in phase 1 (block 2); the peer is dead, stalled or issuing a different collective"
	if e.Error() != want {
		t.Errorf("got %q", e.Error())
	}
}
