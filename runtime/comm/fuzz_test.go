package comm

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/alloc"
	"github.com/collgen/collgen/runtime/cuda"
)

// FuzzFakeCall: any arguments to a collective on the GPU backend (over
// fake devices, world 4, and world 1 for a collective byte from 192 up:
// collective, dtype, op, forced algorithm, count, buffer addresses,
// staging size) end in nil or an error that matches one
// of the package's sentinels, and none panics; the brief's "bad input gets
// a clear typed error". Explain and Choose of the same arguments too. Calls run on rank 0 alone: the fake device records
// launches without waiting for peers.
func FuzzFakeCall(f *testing.F) {
	const world = 4
	comms, devs := fakeComms(f, world, Config{})
	f.Cleanup(func() { closeAll(f, comms) })
	small, _ := fakeComms(f, world, Config{StagingBytes: 64 << 10, Group: "FuzzFakeCallSmall"})
	f.Cleanup(func() { closeAll(f, small) })
	solo, soloDevs := fakeComms(f, 1, Config{Group: "FuzzFakeCallSolo"})
	f.Cleanup(func() { closeAll(f, solo) })
	algs := append([]coll.Algorithm{coll.Auto, "fastest"}, coll.Algorithms()...)
	dtypes := append(coll.DTypes(), "f17")
	ops := append(coll.Ops(), "prod", "")
	f.Add(uint8(0), uint8(0), uint8(0), uint8(0), int64(1024), uint64(0x1000), uint64(0x2000), false)
	f.Add(uint8(1), uint8(3), uint8(2), uint8(1), int64(1)<<62, uint64(0x1001), uint64(0x1001), true)
	f.Add(uint8(2), uint8(5), uint8(6), uint8(3), int64(-1), uint64(0), uint64(3), false)
	f.Add(uint8(200), uint8(2), uint8(1), uint8(0), int64(1)<<61, uint64(0x1000), uint64(0x1000), false)
	f.Fuzz(func(t *testing.T, ci, ai, di, oi uint8, count int64, in, out uint64, smallStaging bool) {
		c := comms[0]
		if smallStaging {
			c = small[0]
		}
		if ci >= 192 {
			c = solo[0]
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
		if err != nil && !hasKind(err) {
			t.Fatalf("%s %s %s %s count %d in %#x out %#x: an error matching no sentinel: %v", collective, o.Algorithm, dt, op, count, in, out, err)
		}
		// Explain and Choose take the same arguments through their own
		// paths: the same rule holds.
		if _, err := c.Explain(collective, ib, ob, int(count), dt, op, o); err != nil && !hasKind(err) {
			t.Fatalf("Explain %s %s %s %s count %d: an error matching no sentinel: %v", collective, o.Algorithm, dt, op, count, err)
		}
		if _, err := c.Choose(collective, count*int64(max(dt.Size(), 1)), dt, op); err != nil && !hasKind(err) {
			t.Fatalf("Choose %s %s %s %d bytes: an error matching no sentinel: %v", collective, dt, op, count*int64(max(dt.Size(), 1)), err)
		}
		devs[0].mu.Lock()
		devs[0].launches = devs[0].launches[:0] // the fuzz loop makes millions
		devs[0].mu.Unlock()
		soloDevs[0].mu.Lock()
		soloDevs[0].copies = soloDevs[0].copies[:0]
		soloDevs[0].mu.Unlock()
	})
}

// FuzzFakeNew: New over fake devices with any staging sizes, block cap,
// timeout and topology name (the same on every rank, worlds 1 to 3), and
// any placement of the ranks on GPUs (place: bit r puts rank r on GPU 0,
// else on a GPU of its own) with any work queues (queues), ends in a
// communicator that runs an all-reduce and closes, or in an error matching
// a sentinel on every rank; none panics, and ranks sharing a GPU with
// fewer than 32 work queues never get a communicator.
func FuzzFakeNew(f *testing.F) {
	topologies := []string{"", "nvswitch", "hcm8", "pcie", "host_shm", "bogus"}
	f.Add(uint8(2), int64(0), int64(0), 0, int64(0), uint8(0), uint8(0), uint8(0))
	f.Add(uint8(3), int64(1<<20), int64(-1), 5, int64(time.Millisecond), uint8(2), uint8(3), uint8(8))
	f.Add(uint8(1), int64(1)<<62, int64(1<<30), 1000, int64(-1), uint8(5), uint8(7), uint8(1))
	f.Add(uint8(1), int64(0), int64(0), 0, int64(0), uint8(0), uint8(3), uint8(32))
	f.Add(uint8(1), int64(0), int64(0), 0, int64(0), uint8(0), uint8(3), uint8(8))
	f.Fuzz(func(t *testing.T, w uint8, staging, budget int64, maxBlocks int, timeout int64, ti, place, queues uint8) {
		world := 1 + int(w)%3
		cfg := Config{StagingBytes: staging, StagingBudget: budget, MaxBlocks: maxBlocks, Timeout: time.Duration(timeout),
			Topology: topologies[int(ti)%len(topologies)], DisableNCCL: true}
		devs := make([]*fakeDevice, world)
		onGPU0 := 0
		for r := range devs {
			devs[r] = &fakeDevice{rank: r, bus: fmt.Sprintf("0000:%02x:00.0", 0x20+r), queues: int(queues)}
			if place&(1<<r) != 0 {
				devs[r].bus = "0000:10:00.0"
				onGPU0++
			}
		}
		// queues 0: the fake's default, 32.
		tooFew := onGPU0 > 1 && queues > 0 && int(queues) < cuda.MaxWorkQueues
		comms, errs := newFakeComms(t, cfg, devs)
		failed := 0
		for r, err := range errs {
			switch {
			case err == nil:
			case hasKind(err):
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
		if tooFew {
			t.Fatalf("New(%+v) made communicators of ranks sharing GPU 0 (place %03b) with %d work queues", cfg, place, queues)
		}
		if err := errors.Join(onRanks(comms, func(_ int, c *Communicator) error {
			return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 4096, coll.F32, coll.Sum, Options{})
		})...); err != nil && !hasKind(err) {
			t.Fatalf("all-reduce after New(%+v): an error matching no sentinel: %v", cfg, err)
		}
		for _, c := range comms {
			c.Abort()
		}
	})
}

// handleRegistrar is a registrar that tracks its live handles: a handle
// deregistered twice, or by the wrong call, is recorded as a fault.
type handleRegistrar struct {
	next   uintptr
	live   map[uintptr]bool // handle -> window
	ranges map[uintptr][2]cuda.DevicePtr
	faults []string
}

func (h *handleRegistrar) checkMemory(cuda.DevicePtr, int64) error { return nil }
func (h *handleRegistrar) noWindows() string                       { return "" }
func (h *handleRegistrar) noRegister() string                      { return "" }
func (h *handleRegistrar) add(p cuda.DevicePtr, bytes int64, window bool) (uintptr, error) {
	h.next++
	h.live[h.next] = window
	h.ranges[h.next] = [2]cuda.DevicePtr{p, p + cuda.DevicePtr(bytes)}
	return h.next, nil
}
func (h *handleRegistrar) drop(handle uintptr, window bool) error {
	w, ok := h.live[handle]
	switch {
	case !ok:
		h.faults = append(h.faults, fmt.Sprintf("handle %d deregistered but not live", handle))
	case w != window:
		h.faults = append(h.faults, fmt.Sprintf("handle %d (window %v) dropped as window %v", handle, w, window))
	}
	delete(h.live, handle)
	delete(h.ranges, handle)
	return nil
}
func (h *handleRegistrar) register(p cuda.DevicePtr, bytes int64) (uintptr, error) {
	return h.add(p, bytes, false)
}
func (h *handleRegistrar) deregister(handle uintptr) error { return h.drop(handle, false) }
func (h *handleRegistrar) registerWindow(p cuda.DevicePtr, bytes int64) (uintptr, error) {
	return h.add(p, bytes, true)
}
func (h *handleRegistrar) deregisterWindow(handle uintptr) error { return h.drop(handle, true) }

// FuzzRegistry drives a communicator's registration registry through any
// sequence of buffer and window registrations (repeats, overlaps, bad
// ranges), deregistrations (unknown and repeated too), the allocator's
// segment hooks and a final close: no panic; every refusal is
// ErrInvalidArgument, or ErrClosed once closed; the registrar never sees a
// handle dropped twice or as the wrong kind; its live handles are exactly
// the registry's; live registrations never overlap; and close leaves none
// (abort leaves them to ncclCommAbort).
func FuzzRegistry(f *testing.F) {
	f.Add([]byte{0, 1, 2, 0, 1, 2, 1, 1, 0, 2, 1, 3, 3, 2, 4, 4, 2, 4, 5, 1, 0, 6, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 300 {
			ops = ops[:300]
		}
		h := &handleRegistrar{live: map[uintptr]bool{}, ranges: map[uintptr][2]cuda.DevicePtr{}}
		g := newRegistry(h, 0)
		arg := func(i int) int {
			if i < len(ops) {
				return int(ops[i])
			}
			return 0
		}
		// Addresses on a 4 KiB grid of 16 slots, sizes of 1-4 slots (or a bad one).
		addr := func(i int) cuda.DevicePtr { return cuda.DevicePtr(0x1_0000_0000 + (arg(i)%16)<<12) }
		size := func(i int) int64 {
			if arg(i) == 255 {
				return -1
			}
			return int64(1+arg(i)%4) << 12
		}
		typed := func(err error) {
			if err != nil && !errors.Is(err, ErrInvalidArgument) && !(g.closed && errors.Is(err, ErrClosed)) {
				t.Fatalf("an error that is not ErrInvalidArgument (nor ErrClosed after close): %v", err)
			}
		}
		aborted := false
		for i := 0; i < len(ops); i += 3 {
			switch ops[i] % 7 {
			case 0:
				typed(g.add(addr(i+1), size(i+2), false))
			case 1:
				typed(g.add(addr(i+1), size(i+2), true))
			case 2:
				typed(g.remove(addr(i+1), false))
			case 3:
				typed(g.remove(addr(i+1), true))
			case 4:
				g.SegmentAllocated(alloc.Segment{Base: addr(i + 1), Bytes: size(i + 2)})
			case 5:
				g.SegmentFreeing(alloc.Segment{Base: addr(i + 1), Bytes: size(i + 2)})
			case 6:
				abort := arg(i+1)%2 == 1
				if !g.closed {
					aborted = abort // the first close decides; later ones do nothing
				}
				typed(g.closeAll(abort))
			}
			if len(h.faults) > 0 {
				t.Fatal(h.faults)
			}
			regs := g.registered()
			if !g.closed && len(regs) != len(h.live) {
				t.Fatalf("registry holds %d registrations, the registrar %d handles", len(regs), len(h.live))
			}
			for k, r := range regs {
				if w, ok := h.live[r.handle]; !ok || w != r.window {
					t.Fatalf("registration %#x (window %v) has handle %d, not live as that", uintptr(r.base), r.window, r.handle)
				}
				for _, q := range regs[:k] {
					if r.base < q.end() && q.base < r.end() {
						t.Fatalf("registrations [%#x, %#x) and [%#x, %#x) overlap", uintptr(r.base), uintptr(r.end()), uintptr(q.base), uintptr(q.end()))
					}
				}
			}
		}
		typed(g.closeAll(false))
		if len(h.faults) > 0 || len(g.registered()) != 0 {
			t.Fatalf("after close: faults %v, %d registrations", h.faults, len(g.registered()))
		}
		// Abort forgets every registration, buffers and windows alike:
		// ncclCommAbort frees them (bc8f33e). Close must deregister all.
		if !aborted && len(h.live) != 0 {
			t.Fatalf("%d handles live after Close", len(h.live))
		}
	})
}
