package cli

import (
	"bytes"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
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
