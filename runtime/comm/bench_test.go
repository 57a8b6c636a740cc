package comm

import (
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
)

// hotCall is one rank's generated-kernel call of the per-call benchmarks
// and the allocation test, over fake devices (nothing runs on a GPU: what
// is measured is the communicator's host path from the call to the
// launch).
type hotCall struct {
	name string
	call func(c *Communicator, sym cuda.DevicePtr) error
}

// hotCalls are a staged call (bf16 all-reduce of 6000 bytes: one-shot LL
// by the shipped rules) and a zero-copy one (f32 one-shot all-reduce whose
// input is symmetric).
var hotCalls = []hotCall{
	{"staged", func(c *Communicator, _ cuda.DevicePtr) error {
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 3000, coll.BF16, coll.Sum, Options{})
	}},
	{"zerocopy", func(c *Communicator, sym cuda.DevicePtr) error {
		return c.AllReduce(DeviceBuffer(sym), DeviceBuffer(0x9000), 1<<15, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
	}},
}

// hotComms makes a world-2 fake communicator pair whose devices count
// launches only, with a symmetric buffer on each rank (returned by rank).
func hotComms(tb testing.TB) ([]*Communicator, []*fakeDevice, []cuda.DevicePtr) {
	tb.Helper()
	comms, devs := fakeComms(tb, 2, Config{})
	syms := allocOnRanks(tb, comms, 1<<20)
	for _, d := range devs {
		d.countOnly = true
	}
	return comms, devs, syms
}

// benchmarkAllReduceFake measures rank 0's calls of hc (the fake device
// needs no peer to launch).
func benchmarkAllReduceFake(b *testing.B, hc hotCall) {
	comms, devs, syms := hotComms(b)
	defer closeAll(b, comms)
	c := comms[0]
	if err := hc.call(c, syms[0]); err != nil { // warm-up
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := hc.call(c, syms[0]); err != nil {
			b.Fatal(err)
		}
	}
	if devs[0].counted == 0 {
		b.Fatal("nothing launched")
	}
}

// BenchmarkAllReduceFake is the host cost of a staged generated-kernel
// all-reduce: resolve, select, pack, launch (fake).
func BenchmarkAllReduceFake(b *testing.B) { benchmarkAllReduceFake(b, hotCalls[0]) }

// BenchmarkAllReduceFakeZeroCopy is the same for a zero-copy call (the
// symmetric lookup and the per-rank stage pointers added).
func BenchmarkAllReduceFakeZeroCopy(b *testing.B) { benchmarkAllReduceFake(b, hotCalls[1]) }
