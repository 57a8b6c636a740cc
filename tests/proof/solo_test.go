package proof

import (
	"bytes"
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

// soloRun is one collective of TestWorldOneGPU on (input, output).
type soloRun struct {
	name string
	run  func(in, out comm.Buffer) error
}

// TestWorldOneGPU: a GPU communicator of one rank runs every collective
// as a copy, bit for bit (NaN payloads and -0.0 included), whatever
// algorithm the call names; in place it leaves the buffer as it was; on a
// caller's stream, captured in a CUDA graph and replayed, too; and from a
// buffer of its Alloc.
func TestWorldOneGPU(t *testing.T) {
	atLeast(t, 1)
	comms := newComms(t, 1, comm.Config{Library: collectives.Library, Group: "solo"})
	defer closeComms(comms)
	c := comms[0]
	dev := c.Device()
	const n = 1<<20 + 3
	in, out := deviceMem(t, dev, 8*n), deviceMem(t, dev, 8*n)
	defer dev.Free(in)
	defer dev.Free(out)
	check := func(what string, p cuda.DevicePtr, want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		if err := dev.CopyDtoH(got, p); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			i := 0
			for got[i] == want[i] {
				i++
			}
			t.Errorf("%s: byte %d is %#x, want %#x", what, i, got[i], want[i])
		}
	}
	for _, dt := range []coll.DType{coll.F32, coll.BF16, coll.F64, coll.E4M3} {
		src := input(dt, n, 3, 0)
		if dt == coll.F32 { // a NaN with a payload and a negative zero
			binary.LittleEndian.PutUint32(src, 0x7fc0_1234)
			binary.LittleEndian.PutUint32(src[4:], math.Float32bits(float32(math.Copysign(0, -1))))
		}
		bytesN := n * dt.Size()
		for _, alg := range []coll.Algorithm{coll.Auto, coll.OneShot, coll.TwoShotLL128, coll.NCCL} {
			o := comm.Options{Algorithm: alg}
			runs := []soloRun{{"allgather", func(i, o2 comm.Buffer) error { return c.AllGather(i, o2, n, dt, o) }}}
			if !dt.IsFloat8() { // fp8 is copy-only
				runs = append(runs,
					soloRun{"allreduce", func(i, o2 comm.Buffer) error { return c.AllReduce(i, o2, n, dt, coll.Sum, o) }},
					soloRun{"reduce_scatter", func(i, o2 comm.Buffer) error { return c.ReduceScatter(i, o2, n, dt, coll.Max, o) }})
			}
			for _, r := range runs {
				what := fmt.Sprintf("%s %s %s", r.name, dt, alg)
				if err := dev.CopyHtoD(in, src); err != nil {
					t.Fatal(err)
				}
				if err := dev.Memset8(out, 0xA7, bytesN); err != nil {
					t.Fatal(err)
				}
				if err := r.run(comm.DeviceBuffer(in), comm.DeviceBuffer(out)); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				check(what, out, src)
				if err := r.run(comm.DeviceBuffer(in), comm.DeviceBuffer(in)); err != nil {
					t.Fatalf("%s in place: %v", what, err)
				}
				check(what+" in place", in, src)
			}
		}
	}
	// A caller's stream, captured and replayed; the input in Alloc's memory.
	sym, err := c.Alloc(context.Background(), 4*n)
	if err != nil {
		t.Fatal(err)
	}
	src := input(coll.F32, n, 9, 0)
	if err := dev.CopyHtoD(sym, src); err != nil {
		t.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if err := dev.Memset8(out, 0, 4*n); err != nil {
		t.Fatal(err)
	}
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	cerr := c.AllReduce(comm.DeviceBuffer(sym), comm.DeviceBuffer(out), n, coll.F32, coll.Sum, comm.Options{Stream: s})
	g, err := s.EndCapture()
	if cerr != nil || err != nil {
		t.Fatalf("capture: %v, %v", cerr, err)
	}
	defer g.Destroy()
	exec, err := g.Instantiate()
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Destroy()
	for range 3 {
		if err := exec.Launch(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Synchronize(s); err != nil {
		t.Fatal(err)
	}
	check("graph replay from Alloc's memory", out, src)
	if p, err := c.Explain(coll.AllReduce, comm.DeviceBuffer(sym), comm.DeviceBuffer(out), n, coll.F32, coll.Sum, comm.Options{}); err != nil || p.Algorithm != coll.Copy {
		t.Errorf("Explain: %+v, %v; want a copy", p, err)
	}
}
