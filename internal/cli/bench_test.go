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
	if n := applyBaseline(base, results); n != 4 {
		t.Errorf("applyBaseline matched %d results, want 4", n)
	}
	for i, want := range []float64{2, 4, 3, 0, 2, 0} {
		if results[i].Ratio != want {
			t.Errorf("result %d (%s %s awkward %v): ratio %v, want %v", i, results[i].Collective, results[i].Algorithm, results[i].Awkward, results[i].Ratio, want)
		}
	}
	if results[4].Baseline != "gloo" {
		t.Errorf("allgather's baseline %q, want gloo", results[4].Baseline)
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
