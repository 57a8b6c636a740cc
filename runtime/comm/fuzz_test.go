package comm

import (
	"errors"
	"testing"
	"time"

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

// FuzzFakeNew: New over fake devices with any staging sizes, block cap,
// timeout and topology name (the same on every rank, worlds 1 to 3) ends
// in a communicator that runs an all-reduce and closes, or in an error
// matching a sentinel on every rank; none panics.
func FuzzFakeNew(f *testing.F) {
	topologies := []string{"", "nvswitch", "hcm8", "pcie", "host_shm", "bogus"}
	f.Add(uint8(2), int64(0), int64(0), 0, int64(0), uint8(0))
	f.Add(uint8(3), int64(1<<20), int64(-1), 5, int64(time.Millisecond), uint8(2))
	f.Add(uint8(1), int64(1)<<62, int64(1<<30), 1000, int64(-1), uint8(5))
	f.Fuzz(func(t *testing.T, w uint8, staging, budget int64, maxBlocks int, timeout int64, ti uint8) {
		world := 1 + int(w)%3
		cfg := Config{StagingBytes: staging, StagingBudget: budget, MaxBlocks: maxBlocks, Timeout: time.Duration(timeout),
			Topology: topologies[int(ti)%len(topologies)], DisableNCCL: true}
		devs := make([]*fakeDevice, world)
		for r := range devs {
			devs[r] = &fakeDevice{rank: r}
		}
		comms, errs := newFakeComms(t, cfg, devs)
		typed := func(err error) bool {
			for _, s := range sentinels {
				if errors.Is(err, s) {
					return true
				}
			}
			return false
		}
		failed := 0
		for r, err := range errs {
			switch {
			case err == nil:
			case typed(err):
				failed++
			default:
				t.Fatalf("rank %d: New(%+v): an error matching no sentinel: %v", r, cfg, err)
			}
		}
		if failed > 0 {
			for _, c := range comms {
				if c != nil {
					c.Abort()
				}
			}
			return
		}
		if err := errors.Join(onRanks(comms, func(_ int, c *Communicator) error {
			return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 4096, coll.F32, coll.Sum, Options{})
		})...); err != nil && !typed(err) {
			t.Fatalf("all-reduce after New(%+v): an error matching no sentinel: %v", cfg, err)
		}
		for _, c := range comms {
			c.Abort()
		}
	})
}
