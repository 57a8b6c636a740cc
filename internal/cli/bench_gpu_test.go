package cli

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/bench/gpubench"
)

// TestGPUBenchFlags: bench_gpu.go adds its flags to bench.go's command and
// sets the gpuBench hook.
func TestGPUBenchFlags(t *testing.T) {
	if gpuBench == nil {
		t.Fatal("gpuBench hook is not set")
	}
	io := &IO{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}}
	root := NewRoot(io)
	cmd, _, err := root.Find([]string{"bench"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"eager", "zero-copy", "processes", "staging", "devices"} {
		if cmd.Flags().Lookup(f) == nil {
			t.Errorf("bench has no --%s flag", f)
		}
	}
}

func TestGPUSweeps(t *testing.T) {
	o := &BenchOptions{World: 4, Collectives: []string{"allreduce", "allgather"}, DTypes: []string{"bf16"},
		Ops: []string{"sum", "max"}, Sizes: []int64{1024}}
	sw, err := gpuSweeps(o, &gpuBenchFlags{})
	if err != nil {
		t.Fatal(err)
	}
	// allreduce sum, allreduce max, allgather (op ignored, once).
	if len(sw) != 3 {
		t.Fatalf("%d sweeps, want 3", len(sw))
	}
	if n := len(sw[0].plan.Shapes); n != 19 {
		t.Errorf("default GPU sizes: %d, want 19 (1KiB..256MiB)", n)
	}
	sw, err = gpuSweeps(o, &gpuBenchFlags{sizesSet: true, staging: "64MiB", maxBlocks: 16, ncclNonBlock: true})
	if err != nil || len(sw[0].plan.Shapes) != 1 || sw[0].plan.Staging != 64<<20 || sw[0].cfg.MaxBlocks != 16 || !sw[0].cfg.NCCLNonBlocking {
		t.Errorf("--sizes/--staging/--max-blocks/--nccl-nonblocking not used: %v", err)
	}
	// A GPU named twice holds several ranks (a sweep on one GPU): the list
	// keeps every entry.
	if sw, err = gpuSweeps(o, &gpuBenchFlags{devices: "0, 0,0,0"}); err != nil {
		t.Errorf("--devices 0,0,0,0: %v", err)
	} else if !slices.Equal(sw[0].cfg.Devices, []int{0, 0, 0, 0}) {
		t.Errorf("--devices 0,0,0,0: devices %v", sw[0].cfg.Devices)
	}
	// The summary's footnote says what the flag's twins depart in.
	for flag, want := range map[string]bench.AwkwardKind{"offset": bench.AwkwardOffset, "count": bench.AwkwardCount, "both": bench.AwkwardBoth} {
		sw, err := gpuSweeps(o, &gpuBenchFlags{sizesSet: true, awkward: flag})
		if err != nil || sw[0].cfg.Awkward != want || awkwardNote(sw) != want.Describe() {
			t.Errorf("--awkward=%s: kind %v, note %q (%v)", flag, sw[0].cfg.Awkward, awkwardNote(sw), err)
		}
	}
	if awkwardNote(nil) != "" {
		t.Error("a footnote without sweeps")
	}
	for _, g := range []*gpuBenchFlags{{staging: "lots"}, {devices: "0,1"}, {devices: "a,b,c,d"}, {awkward: "sideways"}, {maxBlocks: -1}} {
		if _, err := gpuSweeps(o, g); err == nil {
			t.Errorf("%+v: want a usage error", g)
		}
	}
}

func TestGPUReport(t *testing.T) {
	ms := []gpubench.Measurement{
		{Collective: "allreduce", DType: "bf16", Op: "sum", World: 4, Bytes: 1024, Variant: "oneshot", Algorithm: "oneshot", Mode: "graph", LatencyUS: 5, Replays: 10, OpsPerReplay: 20, Check: "ok"},
		{Collective: "allreduce", DType: "bf16", Op: "sum", World: 4, Bytes: 1024, Variant: "twoshot", Algorithm: "twoshot", Mode: "graph", Skipped: "too big"},
		{Collective: "allreduce", DType: "bf16", Op: "sum", World: 4, Bytes: 1024, Variant: "auto", Algorithm: "oneshot", Mode: "graph", LatencyUS: 5, VsNCCL: 3, BusGBps: 0.3},
		{Collective: "allreduce", DType: "bf16", Op: "sum", World: 4, Bytes: 1024, Variant: "nccl", Algorithm: "nccl", Mode: "graph", LatencyUS: 15, VsNCCL: 1},
	}
	rs := gpuResults(ms)
	if len(rs) != 3 || rs[0].Iters != 200 || rs[1].Ratio != 3 || rs[1].Baseline != "nccl" || rs[2].Ratio != 0 {
		t.Errorf("results %+v", rs)
	}
	var b bytes.Buffer
	writeGPUSummary(&b, ms, bench.AwkwardBoth.Describe())
	out := b.String()
	for _, want := range []string{"CUDA-graph replay", "oneshot", "skip", "3.00x", "1KiB", "auto vs best", "1.00 (oneshot)"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "awkward") {
		t.Errorf("a sweep without awkward rows has an awkward footnote:\n%s", out)
	}
	// An awkward twin with the regular size's bytes (--awkward=offset) is a
	// row of its own, marked, with its own ratio.
	twin := slices.Clone(ms)
	for _, m := range ms {
		m.Awkward, m.Offset, m.LatencyUS = true, 2, m.LatencyUS*2
		if m.Variant == "auto" {
			m.VsNCCL = 1.5
		}
		twin = append(twin, m)
	}
	b.Reset()
	writeGPUSummary(&b, twin, bench.AwkwardOffset.Describe())
	out = b.String()
	for _, want := range []string{"1KiB*", "10.00", "3.00x", "1.50x", "* awkward size: the same size, input and output pointers one element off alignment"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary with an offset twin lacks %q:\n%s", want, out)
		}
	}
	// Auto's ratio to the fastest forced algorithm; without forced
	// algorithms, no such column.
	slow := slices.Clone(ms)
	slow[2].LatencyUS = 5.5
	b.Reset()
	writeGPUSummary(&b, slow, bench.AwkwardBoth.Describe())
	if out := b.String(); !strings.Contains(out, "1.10 (oneshot)") {
		t.Errorf("auto 10%% slower than oneshot:\n%s", out)
	}
	b.Reset()
	writeGPUSummary(&b, ms[2:], bench.AwkwardBoth.Describe())
	if out := b.String(); strings.Contains(out, "auto vs best") {
		t.Errorf("a sweep of auto and nccl alone has an auto-vs-best column:\n%s", out)
	}
	if rs := gpuResults(twin); len(rs) != 6 || rs[0].Awkward || !rs[3].Awkward {
		t.Errorf("results of a sweep with twins: %+v", rs)
	}
	var eo, ee bytes.Buffer
	ms[0].Check = "FAIL: rank 1: wrong"
	err := reportGPU(&IO{Out: &eo, Err: &ee}, &BenchOptions{}, ms, "", nil)
	if err == nil || !strings.Contains(ee.String(), "CHECK FAILED") {
		t.Errorf("a check failure must fail loudly: %v\n%s", err, ee.String())
	}
	// A wrong result's time is no result: the JSON and CSV (collgen tune's
	// input) must not carry it as a row like any other.
	for _, r := range gpuResults(ms) {
		if r.Algorithm == "oneshot" {
			t.Errorf("the row whose check failed is among the results: %+v", r)
		}
	}
}

// TestWorkerFlags: --processes hands every GPU sweep flag to the workers
// (--awkward was once dropped there, so process sweeps had no awkward rows).
func TestWorkerFlags(t *testing.T) {
	o := &BenchOptions{Timeout: 90 * time.Second}
	g := &gpuBenchFlags{eager: true, zeroCopy: true, awkward: "count", noEarlyLaunch: true, maxBlocks: 33, ncclNonBlock: true, staging: "64MiB", devices: "1,0", timeoutSet: true}
	got := strings.Join(workerFlags(g, o), " ")
	if want := "--eager --zero-copy --awkward=count --no-early-launch --max-blocks 33 --nccl-nonblocking --staging 64MiB --devices 1,0 --timeout 1m30s"; got != want {
		t.Errorf("worker flags %q, want %q", got, want)
	}
	if got := workerFlags(&gpuBenchFlags{}, o); len(got) != 0 {
		t.Errorf("no flags set: %q", got)
	}
}

// TestAutoVsBest: "auto vs best" compares auto with the fastest forced
// algorithm that gave a valid time. A faster forced row whose --check
// failed (left out of the JSON and CSV) was once taken as the best, so auto
// read 2x slower than a kernel that computes the wrong answer.
func TestAutoVsBest(t *testing.T) {
	row := func(variant string, us float64, check, skipped, failed string) gpubench.Measurement {
		return gpubench.Measurement{Collective: "allreduce", DType: "bf16", Op: "sum", World: 2, Bytes: 1024, Variant: variant,
			Algorithm: "oneshot", Mode: "graph", LatencyUS: us, Check: check, Skipped: skipped, Error: failed}
	}
	auto := row("auto", 4, "ok", "", "")
	wrong := row("oneshot", 2, "FAIL: rank 1: element 3", "", "")
	good := row("twoshot", 5, "ok", "", "")
	skipped := row("oneshot_ll", 0, "", "too big", "")
	failed := row("twoshot_ll", 0, "", "", "launch failed")
	for _, c := range []struct {
		name   string
		auto   gpubench.Measurement
		forced []gpubench.Measurement
		want   string
	}{
		{"a failed check is no best", auto, []gpubench.Measurement{wrong, good, skipped, failed}, "0.80 (twoshot)"},
		{"the fastest valid row", auto, []gpubench.Measurement{good, row("oneshot", 3.2, "", "", "")}, "1.25 (oneshot)"},
		{"no valid forced row", auto, []gpubench.Measurement{wrong, skipped, failed}, "no valid forced"},
		{"auto's check failed", row("auto", 4, "FAIL: rank 0: element 0", "", ""), []gpubench.Measurement{good}, ""},
		{"auto skipped", row("auto", 0, "", "refused", ""), []gpubench.Measurement{good}, ""},
	} {
		ptrs := []*gpubench.Measurement{nil} // a variant not measured at this size
		for i := range c.forced {
			ptrs = append(ptrs, &c.forced[i])
		}
		if got := autoVsBest(&c.auto, ptrs); got != c.want {
			t.Errorf("%s: auto vs best %q, want %q", c.name, got, c.want)
		}
		// The summary's column is this cell.
		var b bytes.Buffer
		writeGPUSummary(&b, append([]gpubench.Measurement{c.auto}, c.forced...), "")
		if out := b.String(); !strings.Contains(out, "auto vs best") || c.want != "" && !strings.Contains(out, c.want) {
			t.Errorf("%s: summary lacks %q:\n%s", c.name, c.want, out)
		}
	}
	if got := autoVsBest(nil, []*gpubench.Measurement{&good}); got != "" {
		t.Errorf("no auto row: %q", got)
	}
}
