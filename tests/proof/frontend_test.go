package proof

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/numeric"
)

// TestDebugCheckGPU runs the debug check mode (COLLGEN_DEBUG_CHECK=1) on
// real GPUs at world 2: count 0 on rank 0 and 1024 on rank 1 fails on both
// ranks with ErrMismatch naming the counts, nothing launches (the next,
// matching all-reduce is correct), and a host buffer given to a GPU
// communicator is refused as such.
func TestDebugCheckGPU(t *testing.T) {
	proofGPUs(t)
	t.Setenv(comm.EnvDebugCheck, "1")
	comms := newComms(t, 2, comm.Config{Library: collectives.Library, DisableNCCL: true, Group: "debugcheck"})
	defer closeComms(comms)
	const n = 1024
	bufs := make([]cuda.DevicePtr, 2)
	ins := make([][]byte, 2)
	for r, cm := range comms {
		var err error
		if bufs[r], err = cm.Device().Alloc(4 * n); err != nil {
			t.Fatal(err)
		}
		defer cm.Device().Free(bufs[r])
		ins[r] = input("f32", n, 7, r)
		if err := cm.Device().CopyHtoD(bufs[r], ins[r]); err != nil {
			t.Fatal(err)
		}
	}
	run := func(count func(r int) int) []error {
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r, cm := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := comm.DeviceBuffer(bufs[r])
				errs[r] = cm.AllReduce(b, b, count(r), coll.F32, coll.Sum, comm.Options{})
			}()
		}
		wg.Wait()
		return errs
	}
	for r, err := range run(func(r int) int { return r * n }) {
		if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), "rank 1 issued allreduce of 1024 f32 sum") {
			t.Errorf("rank %d: %v, want ErrMismatch naming rank 1's count", r, err)
		}
	}
	if err := errors.Join(run(func(int) int { return n })...); err != nil {
		t.Fatal(err)
	}
	for r, cm := range comms {
		out := make([]byte, 4*n)
		if err := cm.Device().CopyDtoH(out, bufs[r]); err != nil {
			t.Fatal(err)
		}
		if err := numeric.Check("f32", "sum", out, ins); err != nil {
			t.Errorf("rank %d after the refused call: %v", r, err)
		}
	}
	// Every rank refuses alike, so the check agrees and each rank returns
	// its own refusal.
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, cm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = cm.AllReduce(comm.HostBuffer(make([]byte, 64)), comm.HostBuffer(make([]byte, 64)), 16, coll.F32, coll.Sum, comm.Options{})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "HostBuffer given to a GPU communicator") {
			t.Errorf("rank %d, host buffer on the GPU: %v", r, err)
		}
	}
}
