package comm

import (
	"errors"
	"slices"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/kernels"
)

// lamportLibrary is the shipped library plus the Lamport twins of its
// world-4 LL128 all-reduce kernels (what tests/gpu/patches/lamport.patch
// generates), for the runtime's part without a GPU.
func lamportLibrary(t *testing.T) *kernels.Library {
	t.Helper()
	src := collectives.Library
	ks := slices.Clone(src.Kernels)
	for _, k := range src.Kernels {
		twin := map[coll.Algorithm]coll.Algorithm{coll.OneShotLL128: coll.OneShotLamport, coll.TwoShotLL128: coll.TwoShotLamport}[k.Algorithm]
		if k.Collective != coll.AllReduce || k.World != 4 || twin == "" || !coll.Lamport.Supports(k.DType) {
			continue
		}
		k.Algorithm, k.Protocol, k.Name = twin, coll.Lamport, k.Name+"_lamport"
		k.Launch.VectorBytes = 16
		ks = append(ks, k)
	}
	if len(ks) == len(src.Kernels) {
		t.Fatal("the shipped library has no world-4 LL128 all-reduce kernels to twin")
	}
	return shippedWith(ks, nil)
}

// TestLamportArea: a library with Lamport kernels gives the protocol an
// area of its own in each stage slot (its inbox must start empty and hold
// nothing but Lamport lines: no other protocol's lines may land there),
// within the staging budget, and a forced Lamport call runs in rounds
// through it when the message does not fit, in windows whose inbox (16
// bytes a 16-byte line, half of LL's) fits the area.
func TestLamportArea(t *testing.T) {
	g, err := newTestGPU(t, Config{WorldSize: 4, DisableNCCL: true, Library: lamportLibrary(t)})
	if err != nil {
		t.Fatal(err)
	}
	area := g.area[coll.Lamport]
	var sum int64
	for _, a := range g.area {
		sum += a
	}
	if area != minArea || g.slotBytes != sum {
		t.Fatalf("areas %v (slot %d bytes): want a lamport area of %d (no rule uses it) in the slot", g.area, g.slotBytes, minArea)
	}
	if total := 2*g.slotBytes + g.scratchBytes + g.signalBytes(); total > DefaultStagingBudget {
		t.Errorf("region %d bytes, over the %d-byte budget", total, DefaultStagingBudget)
	}
	c := frontOf(g)
	small := &call{collective: coll.AllReduce, in: DeviceBuffer(0x1000), out: DeviceBuffer(0x2000), count: 1000, dtype: coll.BF16, op: coll.Sum, o: Options{Algorithm: coll.OneShotLamport}}
	if err := c.resolve(small); err != nil || small.kernel == nil || small.kernel.Protocol != coll.Lamport || small.window != small.chunk {
		t.Fatalf("forced oneshot_lamport at 2000 bytes: %v (kernel %v, window %d of %d)", err, small.kernel, small.window, small.chunk)
	}
	big := &call{collective: coll.AllReduce, in: DeviceBuffer(0x1000), out: DeviceBuffer(0x2000), count: 4<<20 + 3, dtype: coll.BF16, op: coll.Sum, o: Options{Algorithm: coll.TwoShotLamport}}
	if err := c.resolve(big); err != nil || big.window <= 0 || big.window >= big.chunk {
		t.Fatalf("forced twoshot_lamport at 8 MiB: %v (window %d of a %d-element chunk), want rounds", err, big.window, big.chunk)
	}
	if need := big.kernel.SlotBytes(0, big.window*2); need > area || pushWindow(area, big.kernel, big.chunk, 2) != big.window {
		t.Errorf("twoshot_lamport window %d elements: inbox %d bytes over a %d-byte area", big.window, need, area)
	}
	// f64 has no Lamport kernel (it cannot spare a bit pattern): refused,
	// never silently another algorithm.
	f64 := &call{collective: coll.AllReduce, in: DeviceBuffer(0x1000), out: DeviceBuffer(0x2000), count: 1000, dtype: coll.F64, op: coll.Sum, o: Options{Algorithm: coll.OneShotLamport}}
	if err := c.resolve(f64); !errors.Is(err, ErrUnsupported) {
		t.Errorf("forced oneshot_lamport for f64: %v, want ErrUnsupported", err)
	}
}
