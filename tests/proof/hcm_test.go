package proof

import (
	"fmt"
	"slices"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/kernels"
)

// TestProofHCMTopology proves the hybrid-cube-mesh kernels under their own
// topology (Config.Topology is the spec's hybrid_cube_mesh topology, hcm8
// in the shipped spec), which New accepts on any machine where every pair
// of GPUs has peer access, an NVSwitch machine included: every hcm
// combination forced (counts, layouts, graph replay, as TestProofGoroutines
// does), then auto at a size the topology's rules give to hcm, whose plan
// must name hcm. It skips without as many GPUs as the topology's world
// (8) or when $PROOF_WORLDS leaves that world out; TestProofGoroutines
// already runs the same kernels forced under the detected topology.
func TestProofHCMTopology(t *testing.T) {
	ngpu := proofGPUs(t)
	topo, w, bytes := hcmTopology(collectives.Library)
	if topo == "" {
		t.Skip("the library has no hybrid_cube_mesh topology")
	}
	if !slices.Contains(worlds(ngpu), w) {
		t.Skipf("topology %s is world %d: %d GPUs, worlds to prove %v", topo, w, ngpu, worlds(ngpu))
	}
	defer writeSummary(t)
	comms := newComms(t, w, comm.Config{Library: collectives.Library, Topology: topo, StagingBytes: stagingBytes, DisableNCCL: true,
		Group: "proof-" + topo})
	defer closeComms(comms)
	mode := "goroutines, topology " + topo
	for _, c := range collectives.Combinations {
		if c.World != w || c.Algorithm != coll.HCM || !selected(c.Kernel) {
			continue
		}
		proveAndRecord(t, mode, comms, c)
	}
	if bytes == 0 {
		return
	}
	// Auto at the largest size the rules give to hcm, bf16 sum.
	auto := collectives.Combination{Kernel: fmt.Sprintf("allreduce_auto_bf16_sum_w%d", w), Collective: coll.AllReduce,
		DType: coll.BF16, Op: coll.Sum, World: w}
	n := int(bytes / 2)
	p, err := comms[0].Explain(coll.AllReduce, comm.DeviceBuffer(0x1000), comm.DeviceBuffer(1<<40), n, coll.BF16, coll.Sum, comm.Options{})
	if err == nil && p.Algorithm != coll.HCM {
		err = fmt.Errorf("auto at %d bytes plans %s, want hcm (topology %s)", bytes, p.Algorithm, topo)
	}
	if err == nil {
		err = runCase(comms, auto, n, 7, layout{})
	}
	record(mode, auto.Kernel, 1, err)
	if err != nil {
		t.Errorf("%s at %d bytes: %v", auto.Kernel, bytes, err)
	}
}

// hcmTopology is the library's hybrid_cube_mesh topology, its world size,
// and the largest all-reduce size its rules send to hcm (0 when none do);
// "" when it has none.
func hcmTopology(lib *kernels.Library) (topo string, world int, hcmBytes int64) {
	for _, s := range lib.Selections {
		if s.Kind != coll.HybridCubeMesh || len(s.Worlds) == 0 {
			continue
		}
		topo, world = s.Topology, s.Worlds[0]
		if s.Collective != coll.AllReduce {
			continue
		}
		for _, r := range s.Rules {
			if r.Use == coll.HCM && !r.Symmetric && r.UpTo > 0 {
				hcmBytes = r.UpTo
				break
			}
		}
	}
	return topo, world, hcmBytes
}

// TestHCMTopologyShipped: the shipped spec's hybrid-cube-mesh topology is
// found with its world and hcm bound, so TestProofHCMTopology runs on an
// 8-GPU machine instead of skipping. No GPU.
func TestHCMTopologyShipped(t *testing.T) {
	topo, w, bytes := hcmTopology(collectives.Library)
	if topo != "hcm8" || w != 8 || bytes != 256<<10 {
		t.Errorf("hcmTopology = %q, world %d, hcm up to %d bytes; want hcm8, 8, 262144 (spec/collgen.yaml)", topo, w, bytes)
	}
}
