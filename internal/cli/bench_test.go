package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestHostScripts runs the host backend's CLI scripts,
// testdata/script/host_*.txtar: `collgen bench --backend host` over
// processes, goroutines and `collgen run`.
func TestHostScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Files: globScripts(t, "testdata/script/host_*.txtar"),
		Setup: func(env *testscript.Env) error {
			for _, k := range []string{rendezvous.EnvRank, rendezvous.EnvWorldSize, rendezvous.EnvLocalRank,
				rendezvous.EnvStore, rendezvous.EnvSecret, "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} {
				env.Setenv(k, "")
			}
			return nil
		},
	})
}

// TestApplyBaseline: a result takes the baseline row of its own case and
// algorithm (an A/B of two builds over several algorithms, awkward twins
// apart), or the case's only row (another backend's algorithm), and no
// ratio where several rows of other algorithms would make it a guess.
func TestApplyBaseline(t *testing.T) {
	base := []bench.Result{
		{Backend: "gpu", Collective: "allreduce", Algorithm: "oneshot", DType: "bf16", Op: "sum", World: 2, Bytes: 4096, MedianUS: 10},
		{Backend: "gpu", Collective: "allreduce", Algorithm: "twoshot", DType: "bf16", Op: "sum", World: 2, Bytes: 4096, MedianUS: 20},
		{Backend: "gpu", Collective: "allreduce", Algorithm: "oneshot", DType: "bf16", Op: "sum", World: 2, Bytes: 4096, Awkward: true, MedianUS: 30},
		{Backend: "gloo", Collective: "allgather", Algorithm: "ring", DType: "bf16", World: 2, Bytes: 4096, MedianUS: 8},
	}
	results := []bench.Result{
		{Collective: "allreduce", Algorithm: "oneshot", DType: "bf16", Op: "sum", World: 2, Bytes: 4096, MedianUS: 5},
		{Collective: "allreduce", Algorithm: "twoshot", DType: "bf16", Op: "sum", World: 2, Bytes: 4096, MedianUS: 5},
		{Collective: "allreduce", Algorithm: "oneshot", DType: "bf16", Op: "sum", World: 2, Bytes: 4096, Awkward: true, MedianUS: 10},
		{Collective: "allreduce", Algorithm: "auto", DType: "bf16", Op: "sum", World: 2, Bytes: 4096, MedianUS: 5},
		{Collective: "allgather", Algorithm: "oneshot", DType: "bf16", World: 2, Bytes: 4096, MedianUS: 4},
		{Collective: "allgather", Algorithm: "oneshot", DType: "bf16", World: 2, Bytes: 8192, MedianUS: 4},
	}
	if n, amb := applyBaseline(base, results); n != 4 || amb != 0 {
		t.Errorf("applyBaseline matched %d results (%d ambiguous), want 4 (0)", n, amb)
	}
	for i, want := range []float64{2, 4, 3, 0, 2, 0} {
		if results[i].Ratio != want {
			t.Errorf("result %d (%s %s awkward %v): ratio %v, want %v", i, results[i].Collective, results[i].Algorithm, results[i].Awkward, results[i].Ratio, want)
		}
	}
	if results[0].Baseline != "gpu" || results[4].Baseline != "gloo ring" {
		t.Errorf("baselines %q and %q, want gpu (the same algorithm) and gloo ring (the case's only row, of another algorithm)", results[0].Baseline, results[4].Baseline)
	}
}

// TestApplyBaselineAutoApart: auto's row and a forced row of the
// algorithm auto picked are distinct rows. An auto row compares with the
// baseline's auto row and a forced row with its forced row; where the
// baseline cannot tell them apart (an older host bench named auto's row by
// its pick: two "oneshot" rows in one case) neither gets a ratio, where
// the last of them used to be taken.
func TestApplyBaselineAutoApart(t *testing.T) {
	row := func(alg, picked string, us float64) bench.Result {
		return bench.Result{Backend: "host", Collective: "allreduce", Algorithm: alg, Picked: picked, DType: "f32", Op: "sum", World: 2, Bytes: 4096, MedianUS: us}
	}
	results := func() []bench.Result { return []bench.Result{row("auto", "oneshot", 10), row("oneshot", "", 10)} }
	for _, c := range []struct {
		name       string
		base       []bench.Result
		ratios     []float64
		baselines  []string
		matched, n int
	}{
		{"auto and forced apart", []bench.Result{row("auto", "oneshot", 20), row("oneshot", "", 40)}, []float64{2, 4}, []string{"host", "host"}, 2, 0},
		{"forced first in the file", []bench.Result{row("oneshot", "", 40), row("auto", "oneshot", 20)}, []float64{2, 4}, []string{"host", "host"}, 2, 0},
		{"an older file's auto,oneshot", []bench.Result{row("oneshot", "", 20), row("oneshot", "", 40)}, []float64{0, 0}, []string{"", ""}, 0, 1},
		{"an older file's auto alone", []bench.Result{row("oneshot", "", 30)}, []float64{3, 3}, []string{"host oneshot", "host"}, 2, 0},
		{"auto alone", []bench.Result{row("auto", "twoshot", 30)}, []float64{3, 3}, []string{"host", "host auto"}, 2, 0},
	} {
		rs := results()
		matched, amb := applyBaseline(c.base, rs)
		if matched != c.matched || amb != c.n {
			t.Errorf("%s: %d matched, %d ambiguous; want %d, %d", c.name, matched, amb, c.matched, c.n)
		}
		for i, r := range rs {
			if r.Ratio != c.ratios[i] || r.Baseline != c.baselines[i] {
				t.Errorf("%s: %s row: ratio %v against %q, want %v against %q", c.name, r.Algorithm, r.Ratio, r.Baseline, c.ratios[i], c.baselines[i])
			}
		}
	}
}

// TestCheckOutputsBaseline: a --baseline that is not bench results
// (truncated, foreign JSON) is refused by checkOutputs, before the sweep,
// not after it, when its results would be lost.
func TestCheckOutputsBaseline(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"trunc.json":   `[{"backend": "gloo", "collective": "allreduce", "algorithm": "ring",`,
		"foreign.json": `[{"name": "allreduce", "latency": 3.5}]`,
		"object.json":  `{"results": []}`,
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		o := &BenchOptions{Baseline: path}
		if err := o.checkOutputs(); err == nil || !strings.Contains(err.Error(), "--baseline "+path) {
			t.Errorf("%s: checkOutputs() = %v, want an error naming --baseline %s", name, err, path)
		}
	}
}

// TestCheckOutputsDirectory: an output path that is a directory is refused
// before the sweep (creating the file there failed after it).
func TestCheckOutputsDirectory(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []*BenchOptions{{JSON: dir}, {CSV: dir}, {PNG: dir}} {
		if err := o.checkOutputs(); err == nil || !strings.Contains(err.Error(), dir+" is a directory") {
			t.Errorf("%+v: checkOutputs() = %v, want %s is a directory", o, err, dir)
		}
	}
}

// TestReportJSONStdoutMemcpy: with --json - stdout is the JSON alone;
// --memcpy's lines go to stderr (they followed the JSON on stdout), the
// all-reduce's included when its size was rounded down to whole elements
// (4098 bytes asked, 4096 measured).
func TestReportJSONStdoutMemcpy(t *testing.T) {
	var out, errb bytes.Buffer
	o := &BenchOptions{World: 2, JSON: "-", Memcpy: true, Sizes: []int64{4098}}
	results := []bench.Result{{Backend: "host", Collective: "allreduce", Algorithm: "oneshot", DType: "f32", Op: "sum", World: 2, Bytes: 4096, MedianUS: 2}}
	if err := report(&IO{Out: &out, Err: &errb}, o, results); err != nil {
		t.Fatal(err)
	}
	if _, err := bench.ReadJSON(bytes.NewReader(out.Bytes())); err != nil || !json.Valid(out.Bytes()) {
		t.Errorf("stdout is not JSON alone (%v):\n%s", err, out.String())
	}
	if !strings.Contains(errb.String(), "memcpy bandwidth") || !strings.Contains(errb.String(), "algbw") {
		t.Errorf("stderr %q: want the memcpy lines, the all-reduce's too", errb.String())
	}
}
