//go:build cgo

package proof

import (
	"errors"
	"slices"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/topo"
)

// TestDetectedTopology checks on the GPU machine that a communicator
// detects what NVML (`collgen topo`) says its GPUs are and picks the
// library's first topology of that kind at its world size (NCCL only when
// the GPUs lack peer access), at world 2 and at every visible GPU.
func TestDetectedTopology(t *testing.T) {
	n := gpus(t)
	m, nvmlErr := topo.Open()
	if nvmlErr != nil && !errors.Is(nvmlErr, topo.ErrNoNVML) {
		t.Fatal(nvmlErr)
	}
	for _, w := range slices.Compact([]int{2, n}) {
		if !worldGenerated(w) {
			t.Logf("world %d: the library has no GPU topology for it", w)
			continue
		}
		comms := newComms(t, w, comm.Config{Library: collectives.Library, StagingBytes: 1 << 20})
		d := comms[0].Detected()
		t.Logf("world %d: %+v", w, d)
		for r, c := range comms {
			if got := c.Detected(); !slices.Equal(got.BusIDs, d.BusIDs) || got.Topology != d.Topology || got.Kind != d.Kind {
				t.Errorf("world %d: rank %d detected %+v, rank 0 %+v", w, r, got, d)
			}
		}
		if nvmlErr != nil {
			if d.Kind != "peer_access" && d.Kind != "none" || d.NoNVML == "" {
				t.Errorf("world %d without NVML (%v): %+v", w, nvmlErr, d)
			}
		} else {
			ids, err := topo.ParseBusIDs(d.BusIDs)
			if err != nil {
				t.Fatal(err)
			}
			c, err := m.Classify(ids...)
			if err != nil {
				t.Fatal(err)
			}
			if d.Kind != string(c.Kind) || !slices.Equal(d.Corners, c.Corners) {
				t.Errorf("world %d: the communicator detected %s %v, NVML classifies %s %v", w, d.Kind, d.Corners, c.Kind, c.Corners)
			}
			spec, _ := c.Kind.SpecKind()
			if want := firstTopology(spec, w); d.Topology != want {
				t.Errorf("world %d, kind %s: topology %q, want %q", w, c.Kind, d.Topology, want)
			}
		}
		if err := closeComms(comms); err != nil {
			t.Error(err)
		}
	}
}

// worldGenerated reports whether the library has a GPU topology at world w.
func worldGenerated(w int) bool {
	for _, s := range collectives.Library.Selections {
		if s.Kind.IsGPU() && slices.Contains(s.Worlds, w) {
			return true
		}
	}
	return false
}

// firstTopology is the library's first topology of kind k listing world w
// ("" when none, or k is "": NCCL only).
func firstTopology(k coll.TopologyKind, w int) string {
	for _, s := range collectives.Library.Selections {
		if k != "" && s.Kind == k && slices.Contains(s.Worlds, w) {
			return s.Topology
		}
	}
	return ""
}
