package topo_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/topo"
	"github.com/collgen/collgen/runtime/topo/fakenvml"
)

// TestSavedMachines classifies every machine saved with `collgen topo
// --json` under testdata/machines, named <machine>.<kind>.json: the kind
// in the name is what Classify must find for all its GPUs. Saving a real
// machine there makes it a test case; -update (re)writes the fakes'.
func TestSavedMachines(t *testing.T) {
	if *update {
		want := map[string]topo.Kind{"dgx1": topo.HybridCubeMesh, "nvswitch8": topo.NVSwitch, "pcie4": topo.NoPeerAccess, "bridge2": topo.NVLinkMesh}
		for _, name := range fakenvml.Names() {
			lib, _ := fakenvml.New(name)
			var b bytes.Buffer
			if err := detect(t, lib).WriteJSON(&b); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "machines", "fake-"+name+"."+string(want[name])+".json")
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	files, err := filepath.Glob("testdata/machines/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no saved machines: %v", err)
	}
	for _, f := range files {
		parts := strings.Split(filepath.Base(f), ".")
		if len(parts) != 3 {
			t.Errorf("%s: want <machine>.<kind>.json", f)
			continue
		}
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := topo.ReadJSON(fh)
		fh.Close()
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		c, err := m.Classify()
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if string(c.Kind) != parts[1] {
			t.Errorf("%s: classified %s (%s), the name says %s", f, c.Kind, c.Reason, parts[1])
		}
	}
}
