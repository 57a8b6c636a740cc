package topo_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/collgen/collgen/runtime/topo"
)

// FuzzReadMachine feeds any text to ReadJSON, as `collgen topo --machine
// FILE` does: an error, or a machine that writes back to JSON reading as
// the same machine, classifies (all its GPUs, and them in reverse rank
// order, to the same kind; a hybrid cube mesh with corners that put an
// NVLink with peer reads on every cube edge), reports, and lists its world
// kinds without panicking.
func FuzzReadMachine(f *testing.F) {
	files, _ := filepath.Glob("testdata/machines/*.json")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"GPUs":[{"BusID":"0000:07:00.0"}],"Pairs":[[{}]]}`))
	f.Add([]byte(`{"GPUs":[{"BusID":"07:00.0","Links":[{"Kind":"nvswitch"}]},{"BusID":"08:00.0","Links":[{"Kind":"nvswitch"}]}],` +
		`"Pairs":[[{},{"Read":"OK","Level":"SYS"}],[{"Read":"OK"},{}]]}`))
	f.Add([]byte(`{"GPUs":[{"BusID":"0:0.0"},{"BusID":"0:0.0"}],"Pairs":[[{},{}],[{},{}]]}`))
	f.Add([]byte(`{"GPUs":[{"MIG":true,"CPUs":[3,1,2,2],"NUMANode":-7,"DownLinks":-1}],"Pairs":[[{"NVLinks":-3}]],"Unusable":[]}`))
	f.Add([]byte(`{"GPUs":[],"Pairs":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := topo.ReadJSON(bytes.NewReader(data))
		if err != nil {
			if m != nil {
				t.Fatalf("ReadJSON returned a machine and %v", err)
			}
			return
		}
		n := len(m.GPUs)
		if n == 0 || len(m.Pairs) != n {
			t.Fatalf("accepted %d GPUs with %d rows of pairs", n, len(m.Pairs))
		}
		var b1 bytes.Buffer
		if err := m.WriteJSON(&b1); err != nil {
			t.Fatal(err)
		}
		m2, err := topo.ReadJSON(bytes.NewReader(b1.Bytes()))
		if err != nil {
			t.Fatalf("what WriteJSON wrote does not read back: %v\n%s", err, b1.Bytes())
		}
		var b2 bytes.Buffer
		if err := m2.WriteJSON(&b2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1.Bytes(), b2.Bytes()) {
			t.Fatalf("JSON round trip differs:\n%s\n%s", b1.Bytes(), b2.Bytes())
		}

		c, err := m.Classify()
		if err != nil {
			t.Fatalf("Classify of every GPU: %v", err)
		}
		switch c.Kind {
		case topo.NVSwitch, topo.NVLinkMesh, topo.HybridCubeMesh, topo.PCIe, topo.NoPeerAccess:
		default:
			t.Fatalf("unknown kind %q", c.Kind)
		}
		if len(c.GPUs) != n || c.Reason == "" {
			t.Fatalf("classification of %d GPUs: %d bus ids, reason %q", n, len(c.GPUs), c.Reason)
		}
		checkCorners(t, m, c)
		ids := slices.Clone(c.GPUs)
		slices.Reverse(ids)
		rc, err := m.Classify(ids...)
		if err != nil {
			t.Fatalf("Classify of every GPU in reverse: %v", err)
		}
		if rc.Kind != c.Kind {
			t.Fatalf("kind depends on rank order: %s, reversed %s (%s)", c.Kind, rc.Kind, rc.Reason)
		}
		if err := m.WriteReport(io.Discard, c); err != nil {
			t.Fatal(err)
		}
		if n <= 10 { // 2^n subsets
			for k, ws := range m.WorldKinds() {
				for _, w := range ws {
					if w < 2 || w > n {
						t.Fatalf("kind %s at world %d of %d GPUs", k, w, n)
					}
				}
			}
		}
	})
}

// checkCorners checks a hybrid cube mesh's rank-to-corner map: a
// permutation of 0-7 with a direct NVLink and peer reads, both ways, on
// every edge of the cube (same quad, or counterparts).
func checkCorners(t *testing.T, m *topo.Machine, c *topo.Classification) {
	t.Helper()
	if c.Kind != topo.HybridCubeMesh {
		if c.Corners != nil {
			t.Fatalf("kind %s with corners %v", c.Kind, c.Corners)
		}
		return
	}
	if len(c.Corners) != 8 {
		t.Fatalf("hybrid cube mesh with corners %v", c.Corners)
	}
	rankAt := make([]int, 8)
	seen := make([]bool, 8)
	for r, k := range c.Corners {
		if k < 0 || k >= 8 || seen[k] {
			t.Fatalf("corners %v: not a permutation of 0-7", c.Corners)
		}
		seen[k], rankAt[k] = true, r
	}
	for a := 0; a < 8; a++ {
		for b := a + 1; b < 8; b++ {
			if a/4 != b/4 && a^4 != b {
				continue
			}
			i, j := m.GPU(c.GPUs[rankAt[a]]), m.GPU(c.GPUs[rankAt[b]])
			p, q := m.Pairs[i][j], m.Pairs[j][i]
			if p.NVLinks <= 0 || q.NVLinks <= 0 || p.Read != topo.P2POK || q.Read != topo.P2POK {
				t.Fatalf("corners %v: cube edge %d-%d (GPUs %d, %d) has no NVLink with peer reads", c.Corners, a, b, i, j)
			}
		}
	}
}

// FuzzParseBusID feeds any text to ParseBusID, as --gpus and the ranks'
// CUDA bus ids reach it: an error, or an id with device below 0x20 and
// function below 8 whose String parses back to it, as the NVML form
// (eight-digit domain, upper case) does.
func FuzzParseBusID(f *testing.F) {
	for _, s := range []string{"0000:07:00.0", "00000000:07:00.0", "07:1F.7", " 0001:ff:1f.7 ", "0:0:20.0", "07:00.8",
		"ffffffff:00:00.0", "100000000:00:00.0", "07:00", "+7:00.0", "0x7:00.0", "::.", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := topo.ParseBusID(s)
		if err != nil {
			if b != (topo.BusID{}) {
				t.Fatalf("%q: error %v with id %v", s, err, b)
			}
			return
		}
		if b.Device > 0x1f || b.Function > 7 {
			t.Fatalf("%q: device %#x function %d", s, b.Device, b.Function)
		}
		for _, form := range []string{b.String(), fmt.Sprintf("%08X:%02X:%02X.%X", b.Domain, b.Bus, b.Device, b.Function)} {
			if b2, err := topo.ParseBusID(form); err != nil || b2 != b {
				t.Fatalf("%q: %v formats as %q, which parses as %v, %v", s, b, form, b2, err)
			}
		}
	})
}
