package proof

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda"
)

// TestProofZeroCopyInPlace: in-place all-gather (input = the output's own
// block) and in-place all-reduce (input = output) on symmetric memory
// (Communicator.Alloc), at sizes the rules send symmetric inputs to the
// zero-copy one-shot, give right results. Zero-copy read an in-place
// all-gather's peers at this rank's offset (wrong data, no error) and the
// one-shot all-reduce wrote its output while peers still read it; both
// are staged now (comm's inPlaceStaged). So is an all-gather whose input
// is the start of its output on every rank (in place on rank 0 only: rank
// 1 read zero-copy, case 116), while a reduce-scatter in NCCL's in-place
// layout may stay zero-copy and must be right. World: every GPU, or all
// ranks on one shared GPU; NCCL off (the staged rules at world 2 use none).
func TestProofZeroCopyInPlace(t *testing.T) {
	proofGPUs(t)
	comms := newComms(t, 2, comm.Config{Library: collectives.Library, DisableNCCL: true, Group: "inplace"})
	defer closeComms(comms)
	w := len(comms)
	const count = 4 << 20 // f32 per rank: 16 MiB all-reduce, 32 MiB gathered at world 2
	bufs := make([]cuda.DevicePtr, w)
	if err := ranks(comms, func(r int, c *comm.Communicator) (err error) {
		bufs[r], err = c.Alloc(context.Background(), 4*count*w)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	put := func(c *comm.Communicator, at cuda.DevicePtr, vals func(i int) float32, n int) error {
		host := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(host[4*i:], math.Float32bits(vals(i)))
		}
		return c.Device().CopyHtoD(at, host)
	}
	check := func(c *comm.Communicator, at cuda.DevicePtr, want func(i int) float32, n int) error {
		host := make([]byte, 4*n)
		if err := c.Device().CopyDtoH(host, at); err != nil {
			return err
		}
		for i := range n {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(host[4*i:])); got != want(i) {
				return fmt.Errorf("element %d: %v, want %v", i, got, want(i))
			}
		}
		return nil
	}
	// All-gather: rank r's input is block r of its output.
	err := ranks(comms, func(r int, c *comm.Communicator) error {
		in := bufs[r] + cuda.DevicePtr(4*count*r)
		if err := put(c, in, func(i int) float32 { return float32(1000*(r+1) + i%13) }, count); err != nil {
			return err
		}
		p, err := c.Explain(coll.AllGather, comm.DeviceBuffer(in), comm.DeviceBuffer(bufs[r]), count, coll.F32, "", comm.Options{})
		if err != nil {
			return err
		}
		t.Logf("rank %d, in-place all-gather of %d bytes: %+v", r, 4*count*w, p)
		if err := c.AllGather(comm.DeviceBuffer(in), comm.DeviceBuffer(bufs[r]), count, coll.F32, comm.Options{}); err != nil {
			return err
		}
		for q := range w {
			if err := check(c, bufs[r]+cuda.DevicePtr(4*count*q), func(i int) float32 { return float32(1000*(q+1) + i%13) }, count); err != nil {
				return fmt.Errorf("rank %d, block of rank %d: %w", r, q, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("in-place all-gather: %v", err)
	}
	// All-gather with its input at the start of its output on every rank
	// (reliability case 116): in place on rank 0 only, so zero-copy read
	// rank 1's input while rank 1 overwrote it; every rank stages now.
	err = ranks(comms, func(r int, c *comm.Communicator) error {
		if err := put(c, bufs[r], func(i int) float32 { return float32(2000*(r+1) + i%11) }, count); err != nil {
			return err
		}
		p, err := c.Explain(coll.AllGather, comm.DeviceBuffer(bufs[r]), comm.DeviceBuffer(bufs[r]), count, coll.F32, "", comm.Options{})
		if err != nil {
			return err
		}
		if err := c.AllGather(comm.DeviceBuffer(bufs[r]), comm.DeviceBuffer(bufs[r]), count, coll.F32, comm.Options{}); err != nil {
			return err
		}
		for q := range w {
			if err := check(c, bufs[r]+cuda.DevicePtr(4*count*q), func(i int) float32 { return float32(2000*(q+1) + i%11) }, count); err != nil {
				return fmt.Errorf("rank %d (%+v), block of rank %d: %w", r, p, q, err)
			}
		}
		if p.ZeroCopy {
			return fmt.Errorf("rank %d: an all-gather whose output overlaps its symmetric input is read in place: %+v", r, p)
		}
		return nil
	})
	if err != nil {
		t.Errorf("all-gather with in == out: %v", err)
	}
	// Reduce-scatter in NCCL's in-place layout (out = in + rank's chunk):
	// no peer reads a rank's own chunk, so it may stay zero-copy.
	err = ranks(comms, func(r int, c *comm.Communicator) error {
		if err := put(c, bufs[r], func(i int) float32 { return float32(i%5 + r + 1) }, count*w); err != nil {
			return err
		}
		out := bufs[r] + cuda.DevicePtr(4*count*r)
		p, err := c.Explain(coll.ReduceScatter, comm.DeviceBuffer(bufs[r]), comm.DeviceBuffer(out), count, coll.F32, coll.Sum, comm.Options{})
		if err != nil {
			return err
		}
		t.Logf("rank %d, in-place reduce-scatter of %d bytes: %+v", r, 4*count*w, p)
		if err := c.ReduceScatter(comm.DeviceBuffer(bufs[r]), comm.DeviceBuffer(out), count, coll.F32, coll.Sum, comm.Options{}); err != nil {
			return err
		}
		// Element i of chunk r is input element r*count+i on every rank.
		return check(c, out, func(i int) float32 { return float32(w*((r*count+i)%5) + w*(w+1)/2) }, count)
	})
	if err != nil {
		t.Errorf("in-place reduce-scatter: %v", err)
	}
	// All-reduce in place, three times (the race was timing-dependent).
	n := count * w
	for round := range 3 {
		err := ranks(comms, func(r int, c *comm.Communicator) error {
			if err := put(c, bufs[r], func(i int) float32 { return float32(i%7 + r + 1) }, n); err != nil {
				return err
			}
			if err := c.AllReduce(comm.DeviceBuffer(bufs[r]), comm.DeviceBuffer(bufs[r]), n, coll.F32, coll.Sum, comm.Options{}); err != nil {
				return err
			}
			return check(c, bufs[r], func(i int) float32 { return float32(w*(i%7) + w*(w+1)/2) }, n)
		})
		if err != nil {
			t.Errorf("in-place all-reduce, round %d: %v", round, err)
		}
	}
}
