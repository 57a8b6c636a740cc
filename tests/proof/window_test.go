package proof

import (
	"fmt"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/numeric"
)

// windowStaging is a staging area so small that every barrier kernel runs
// the proof's larger counts in many rounds (cg_window), on few blocks.
const windowStaging = 16 << 10

// TestProofWindows proves every barrier kernel run in rounds over windows
// of every chunk, the last one partial: first with windowStaging (many
// rounds), then with the default staging (kernels.WindowBytes: the large
// count in a few rounds on the full grid). Each combination runs the
// cases of TestProofGoroutines (eager, in place and out of place, odd
// counts and offsets), then a CUDA graph of three collectives of several
// rounds each, replayed five times (replays go on advancing the
// collective counter by the rounds), then a push kernel, whose slot and
// flag follow from that counter. Explain must report more than one round
// for the large count, so the test cannot pass without rounds.
func TestProofWindows(t *testing.T) {
	ngpu := proofGPUs(t)
	defer writeSummary(t)
	for _, w := range worlds(ngpu) {
		for _, staging := range []int64{windowStaging, 0} {
			mode := fmt.Sprintf("windows-%dB", staging)
			if staging == 0 {
				mode = "windows-default"
			}
			comms := newComms(t, w, comm.Config{Library: collectives.Library, StagingBytes: staging, DisableNCCL: true, Group: fmt.Sprintf("%s-w%d", mode, w)})
			for _, c := range collectives.Combinations {
				if c.World != w || !selected(c.Kernel) || !collectives.Library.Windowed(c.Collective, c.Algorithm, w) {
					continue
				}
				area := staging
				if area == 0 {
					area = kernels.WindowBytes
				}
				cases, err := proveWindows(comms, c, area, staging == windowStaging)
				record(mode, c.Kernel, cases, err)
				if err != nil {
					t.Errorf("%s, %s: %v", mode, c.Kernel, err)
				}
			}
			if err := closeComms(comms); err != nil {
				t.Errorf("close at world %d: %v", w, err)
			}
		}
	}
}

// proveWindows runs one combination's cases, checks that the large count
// runs in rounds when it exceeds the area, and with graph also the graph
// and the push kernel after.
func proveWindows(comms []*comm.Communicator, c collectives.Combination, area int64, graph bool) (int, error) {
	large := counts(c.Collective, len(comms), true)
	n := large[len(large)-1]
	bytes := int64(n) * int64(c.DType.Size())
	if c.Collective != coll.AllReduce {
		bytes *= int64(len(comms))
	}
	// What the call needs of the area in one round: the message, or a
	// reduce-scatter's or all-gather's push inbox (W-1 places of one
	// rank's block, as lines).
	need := bytes
	k, ok := collectives.Library.Kernel(c.Collective, c.Algorithm, c.DType, c.Op, len(comms))
	pushBlocks := ok && k.Push() && c.Collective != coll.AllReduce
	if pushBlocks {
		need = k.SlotBytes(bytes, bytes/int64(len(comms)))
	}
	if rounds, err := roundsOf(comms[0], c, n); err != nil || (need > area && rounds < 2) {
		return 0, fmt.Errorf("count %d (%d bytes needing %d of a %d-byte area) runs in %d rounds (%v); want several", n, bytes, need, area, rounds, err)
	}
	cases, err := proveCombination(comms, c, true)
	if err != nil || !graph {
		return cases, err
	}
	n = 40000 // all-reduce: 5 rounds of 2-byte elements in 16 KiB, more for wider ones
	switch {
	case pushBlocks:
		n = 20011 // per rank: one inbox place of 1-byte elements over 16 KiB as LL128 lines
	case c.Collective != coll.AllReduce:
		n = 10007 // per rank: at least two rounds for 1-byte elements at world 2
	}
	if rounds, err := roundsOf(comms[0], c, n); err != nil || rounds < 2 {
		return cases, fmt.Errorf("graph count %d runs in %d rounds (%v); want several", n, rounds, err)
	}
	g, err := proveGraphCount(comms, c, n)
	cases += g
	if err != nil {
		return cases, fmt.Errorf("graph of %d elements: %w", n, err)
	}
	// A push kernel after the rounds moved the collective counter.
	const m = 128
	ins := make([][]byte, len(comms))
	for r := range ins {
		ins[r] = input("f32", m, cases, r)
	}
	outs, err := allReduceEach(comms, "oneshot_ll", m, ins)
	if err != nil {
		return cases, fmt.Errorf("oneshot_ll after rounds: %w", err)
	}
	for r, out := range outs {
		if err := numeric.Check("f32", "sum", out, ins); err != nil {
			return cases, fmt.Errorf("oneshot_ll after rounds, rank %d: %w", r, err)
		}
	}
	return cases + 1, nil
}

// roundsOf is how many rounds a forced call of the combination with n
// elements (per rank for reduce-scatter and all-gather) runs.
func roundsOf(cm *comm.Communicator, c collectives.Combination, n int) (int64, error) {
	// Explain runs nothing; device pointers outside symmetric memory plan a staged call.
	p, err := cm.Explain(c.Collective, comm.DeviceBuffer(0x1000), comm.DeviceBuffer(1<<40), n, c.DType, c.Op, comm.Options{Algorithm: c.Algorithm})
	return p.Rounds, err
}
