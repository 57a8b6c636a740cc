package topo_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/collgen/collgen/runtime/topo"
	"github.com/collgen/collgen/runtime/topo/fakenvml"
)

// TestWorldKinds16 runs WorldKinds on a 16-GPU machine whose NVLink graph
// makes the cube search work hard: every pair linked except GPU i and
// i+8, so no 9 GPUs are fully connected and many 8-GPU sets need the
// search. It must stay fast (every subset is classified).
func TestWorldKinds16(t *testing.T) {
	l := fakenvml.Layout{Name: "test GPU", P2P: func(i, j int) nvml.GpuP2PStatus { return nvml.P2P_STATUS_OK },
		Level: func(i, j int) nvml.GpuTopologyLevel { return nvml.TOPOLOGY_SYSTEM }}
	for i := 0; i < 16; i++ {
		l.BusIDs = append(l.BusIDs, fmt.Sprintf("00000000:%02X:00.0", i+1))
		row := make([]int, 16)
		for j := range row {
			if j != i && j != (i+8)%16 {
				row[j] = 1
			}
		}
		l.NVLinks = append(l.NVLinks, row)
	}
	m, err := topo.Detect(fakenvml.Build(l))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wk := m.WorldKinds()
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("WorldKinds took %v", d)
	}
	t.Logf("%v in %v", wk, time.Since(start))
	// 8 GPUs with a missing pair still hold a cube (it needs 16 of the
	// 28 pairs); 9 or more never are a mesh.
	if fmt.Sprint(wk[topo.NVLinkMesh]) != "[2 3 4 5 6 7 8]" || fmt.Sprint(wk[topo.HybridCubeMesh]) != "[8]" ||
		fmt.Sprint(wk[topo.PCIe]) != "[2 3 4 5 6 7 9 10 11 12 13 14 15 16]" {
		t.Errorf("%v", wk)
	}
}
