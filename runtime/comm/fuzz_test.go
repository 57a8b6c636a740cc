package comm

import (
	"errors"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
)

// FuzzFakeCall: any arguments to a collective on the GPU backend (over
// fake devices, world 4: collective, dtype, op, forced algorithm, count,
// buffer addresses, staging size) end in nil or an error that matches one
// of the package's sentinels, and none panics; the brief's "bad input gets
// a clear typed error". Calls run on rank 0 alone: the fake device records
// launches without waiting for peers.
func FuzzFakeCall(f *testing.F) {
	const world = 4
	comms, devs := fakeComms(f, world, Config{})
	f.Cleanup(func() { closeAll(f, comms) })
	small, _ := fakeComms(f, world, Config{StagingBytes: 64 << 10, Group: "FuzzFakeCallSmall"})
	f.Cleanup(func() { closeAll(f, small) })
	algs := append([]coll.Algorithm{coll.Auto, "fastest"}, coll.Algorithms()...)
	dtypes := append(coll.DTypes(), "f17")
	ops := append(coll.Ops(), "prod", "")
	f.Add(uint8(0), uint8(0), uint8(0), uint8(0), int64(1024), uint64(0x1000), uint64(0x2000), false)
	f.Add(uint8(1), uint8(3), uint8(2), uint8(1), int64(1)<<62, uint64(0x1001), uint64(0x1001), true)
	f.Add(uint8(2), uint8(5), uint8(6), uint8(3), int64(-1), uint64(0), uint64(3), false)
	f.Fuzz(func(t *testing.T, ci, ai, di, oi uint8, count int64, in, out uint64, smallStaging bool) {
		c := comms[0]
		if smallStaging {
			c = small[0]
		}
		collective := coll.Collectives()[int(ci)%len(coll.Collectives())]
		dt := dtypes[int(di)%len(dtypes)]
		op := ops[int(oi)%len(ops)]
		o := Options{Algorithm: algs[int(ai)%len(algs)]}
		ib, ob := DeviceBuffer(cuda.DevicePtr(in)), DeviceBuffer(cuda.DevicePtr(out))
		var err error
		switch collective {
		case coll.AllReduce:
			err = c.AllReduce(ib, ob, int(count), dt, op, o)
		case coll.ReduceScatter:
			err = c.ReduceScatter(ib, ob, int(count), dt, op, o)
		default:
			err = c.AllGather(ib, ob, int(count), dt, o)
		}
		if err != nil {
			for _, s := range sentinels {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("%s %s %s %s count %d in %#x out %#x: an error matching no sentinel: %v", collective, o.Algorithm, dt, op, count, in, out, err)
		}
		devs[0].mu.Lock()
		devs[0].launches = devs[0].launches[:0] // the fuzz loop makes millions
		devs[0].mu.Unlock()
	})
}
