package comm

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
)

// TestFakeWorldOne: a GPU communicator of one rank (no topology of the
// library generates world size 1, and none can: the spec refuses it) sets
// up nothing collective (no region, kernels or NCCL) and runs every call,
// whatever algorithm it names, as a copy of its input to its output
// (nothing in place); Explain and Choose report coll.Copy; registration
// says why NCCL is not there; Alloc works.
func TestFakeWorldOne(t *testing.T) {
	comms, devs := fakeComms(t, 1, Config{})
	c, d := comms[0], devs[0]
	defer closeAll(t, comms)
	if d.setups != 0 || len(d.preloaded) != 0 || d.ncclOpen {
		t.Fatalf("world 1 set up %d regions, preloaded %d kernels, NCCL opened %v; want nothing", d.setups, len(d.preloaded), d.ncclOpen)
	}
	const in, out, n = cuda.DevicePtr(0x1000), cuda.DevicePtr(0x900000), 1000
	for _, alg := range []coll.Algorithm{coll.Auto, coll.OneShot, coll.TwoShotLL128, coll.NCCL, coll.HCM} {
		o := Options{Algorithm: alg}
		calls := []struct {
			name  string
			run   func(in, out Buffer) error
			bytes int64
		}{
			{"allreduce", func(i, o2 Buffer) error { return c.AllReduce(i, o2, n, coll.BF16, coll.Max, o) }, 2 * n},
			{"reduce_scatter", func(i, o2 Buffer) error { return c.ReduceScatter(i, o2, n, coll.F32, coll.Sum, o) }, 4 * n},
			{"allgather", func(i, o2 Buffer) error { return c.AllGather(i, o2, n, coll.E4M3, o) }, n},
		}
		for _, cl := range calls {
			d.copies = nil
			if err := cl.run(DeviceBuffer(in), DeviceBuffer(out)); err != nil {
				t.Fatalf("%s, %s: %v", cl.name, alg, err)
			}
			if err := cl.run(DeviceBuffer(in), DeviceBuffer(in)); err != nil {
				t.Fatalf("%s in place, %s: %v", cl.name, alg, err)
			}
			want := []fakeCopy{{out, in, cl.bytes}}
			if len(d.copies) != 1 || d.copies[0] != want[0] {
				t.Errorf("%s, %s: copies %+v, want %+v (none in place)", cl.name, alg, d.copies, want)
			}
		}
		p, err := c.Explain(coll.AllReduce, DeviceBuffer(in), DeviceBuffer(out), n, coll.F32, coll.Sum, o)
		if err != nil || p != (Plan{Algorithm: coll.Copy}) {
			t.Errorf("Explain with %s: %+v, %v; want a copy", alg, p, err)
		}
	}
	if len(d.launches) != 0 || len(d.nccl) != 0 {
		t.Errorf("world 1 launched %d kernels and %d NCCL calls", len(d.launches), len(d.nccl))
	}
	if a, err := c.Choose(coll.AllGather, 1<<30, coll.BF16, ""); err != nil || a != coll.Copy {
		t.Errorf("Choose: %q, %v; want copy", a, err)
	}
	if err := c.AllReduce(DeviceBuffer(in), DeviceBuffer(out), n, coll.BF16, coll.Sum, Options{Algorithm: coll.Copy}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("forcing copy: %v, want ErrInvalidArgument (not an algorithm a call names)", err)
	}
	err := c.RegisterWindow(context.Background(), 0xa000_0000, 1<<20)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "one rank") {
		t.Errorf("RegisterWindow at world 1: %v; want ErrUnsupported saying a one-rank communicator needs no NCCL", err)
	}
	if p, err := c.Alloc(context.Background(), 4096); err != nil || p == 0 {
		t.Errorf("Alloc at world 1: %#x, %v", uintptr(p), err)
	}
	// A topology of the library is accepted (and unused), a misspelt one
	// refused, as at any world size.
	named, errs := newFakeComms(t, Config{Topology: "nvswitch"}, []*fakeDevice{{}})
	if errs[0] != nil {
		t.Errorf("Topology nvswitch at world 1: %v", errs[0])
	} else {
		closeAll(t, named)
	}
	_, errs = newFakeComms(t, Config{Topology: "nvswich"}, []*fakeDevice{{}})
	if !errors.Is(errs[0], ErrInvalidArgument) || !strings.Contains(errs[0].Error(), `"nvswich"`) {
		t.Errorf("a misspelt topology at world 1: %v; want ErrInvalidArgument naming it", errs[0])
	}
}

// TestFakeWorldSizeNotGenerated: a world size no GPU topology of the
// library generates is NCCL only, as GPUs no topology fits, saying why
// (Detected().Reason); an explicit algorithm and Alloc are refused with
// that reason. Before, New failed on every rank.
func TestFakeWorldSizeNotGenerated(t *testing.T) {
	comms, _ := fakeComms(t, 5, Config{})
	defer closeAll(t, comms)
	const why = "no GPU topology of the library generates world size 5, so every collective uses NCCL: add 5 to a topology's world_sizes and regenerate"
	c := comms[0]
	if d := c.Detected(); d.Topology != "" || !strings.HasSuffix(d.Reason, why) {
		t.Fatalf("detected %+v", d)
	}
	if a, err := c.Choose(coll.AllReduce, 1<<10, coll.BF16, coll.Sum); err != nil || a != coll.NCCL {
		t.Errorf("auto chooses %s, %v; want nccl", a, err)
	}
	err := c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x2000), 512, coll.BF16, coll.Sum, Options{Algorithm: coll.OneShot})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), why) {
		t.Errorf("explicit one-shot: %v", err)
	}
	if _, err := c.Alloc(context.Background(), 1<<20); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "NCCL only (") {
		t.Errorf("alloc: %v", err)
	}
}

// A world size no topology generates, with NCCL disabled, fails New with
// ErrUnsupported saying so, not that no generated kernel runs "on these
// GPUs" (they would, at a generated world size), as Alloc's and an
// explicit algorithm's refusals already say.
func TestFakeWorldSizeNotGeneratedNoNCCL(t *testing.T) {
	devs := make([]*fakeDevice, 5)
	for r := range devs {
		devs[r] = &fakeDevice{rank: r}
	}
	_, errs := newFakeComms(t, Config{DisableNCCL: true}, devs)
	for r, err := range errs {
		if !errors.Is(err, ErrUnsupported) || strings.Contains(err.Error(), "on these GPUs") ||
			!strings.Contains(err.Error(), "add 5 to a topology's world_sizes") || !strings.Contains(err.Error(), "Config.DisableNCCL") {
			t.Errorf("rank %d: %v; want ErrUnsupported naming the missing world size and DisableNCCL", r, err)
		}
	}
}
