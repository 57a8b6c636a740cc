package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/collgen/collgen/runtime/topo"
)

// TestTopoScripts runs the `collgen topo` and `collgen tune` scripts,
// testdata/script/topo_*.txtar and tune_*.txtar.
func TestTopoScripts(t *testing.T) {
	files := append(globScripts(t, "testdata/script/topo_*.txtar"), globScripts(t, "testdata/script/tune_*.txtar")...)
	testscript.Run(t, testscript.Params{Files: files})
}

// TestTopoFlags checks flag parsing into the options, with the run
// replaced.
func TestTopoFlags(t *testing.T) {
	var got *topoOptions
	var out bytes.Buffer
	cmd := newCmdTopo(&IO{Out: &out, Err: &out}, &topoOptions{}, func(o *topoOptions) error { got = o; return nil })
	cmd.SetArgs([]string{"--gpus", "0000:07:00.0,0000:0f:00.0", "--spec", "m.yaml", "--base", "spec", "--fake", "dgx1"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if len(got.GPUs) != 2 || got.GPUs[1] != "0000:0f:00.0" || got.Spec != "m.yaml" || got.Base != "spec" || got.Fake != "dgx1" {
		t.Errorf("options %+v", got)
	}
}

// TestTopoNoNVML: where NVML is missing (as in CI), collgen topo exits 1
// naming the library and what to do. Skipped where NVML works.
func TestTopoNoNVML(t *testing.T) {
	if _, err := topo.Open(); !errors.Is(err, topo.ErrNoNVML) {
		t.Skipf("NVML works here (or fails otherwise: %v)", err)
	}
	var out, errb bytes.Buffer
	code := Do([]string{"topo"}, strings.NewReader(""), &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "collgen: topo: nvmlInit: ") ||
		!strings.Contains(errb.String(), "install the NVIDIA driver") && !strings.Contains(errb.String(), "kernel driver is not loaded") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
}
