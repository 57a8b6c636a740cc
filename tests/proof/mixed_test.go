package proof

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/numeric"
)

// TestMixedProtocols runs push kernels in stage slots that kernels of other
// protocols used two collectives earlier, with data crafted to hold the
// push kernel's flag. The e-th collective of a communicator uses slot e&1
// and, if it pushes, flag e/2+1 (common.cuh.tmpl). A barrier kernel stages
// raw input, and an LL128 line carries payload where an LL line has its
// flags, so if protocols shared a slot's bytes, a reader would take such a
// stale line for its peer's data. The communicator gives each protocol its
// own area of every slot; this test fails if that is ever undone.
func TestMixedProtocols(t *testing.T) {
	ngpu := proofGPUs(t)
	w := min(ngpu, 4)
	comms := newComms(t, w, comm.Config{Library: collectives.Library, DisableNCCL: true, Group: "mixed"})
	defer closeComms(comms)
	const n = 1 << 14 // f32 elements: 64 KiB, inside every algorithm's rules
	steps := []struct {
		alg  string
		word uint32 // fill every input word with this; 0: random data, checked
	}{
		{"oneshot", 2},       // epoch 0, slot 0: barrier stage holds 2 = flag of epoch 2
		{"oneshot", 1},       // epoch 1
		{"oneshot_ll", 0},    // epoch 2: slot 0, flag 2
		{"oneshot_ll128", 3}, // epoch 3, slot 1: LL128 payload words 3 = flag of epoch 5
		{"oneshot", 1},       // epoch 4
		{"oneshot_ll", 0},    // epoch 5: slot 1, flag 3
		{"twoshot", 5},       // epoch 6, slot 0: barrier stage holds 5 = flag of epoch 8
		{"oneshot_ll", 1},    // epoch 7
		{"twoshot_ll128", 0}, // epoch 8: slot 0, flag 5
		{"oneshot_ll128", 0}, // epoch 9: slot 1, flag 5, after LL lines of epoch 7
	}
	for e, st := range steps {
		ins := make([][]byte, w)
		for r := range ins {
			if st.word == 0 {
				ins[r] = input("f32", n, e, r)
				continue
			}
			ins[r] = make([]byte, 4*n)
			for i := 0; i < n; i++ {
				binary.LittleEndian.PutUint32(ins[r][4*i:], st.word)
			}
		}
		outs, err := allReduceEach(comms, st.alg, n, ins)
		if err != nil {
			t.Fatalf("collective %d (%s): %v", e, st.alg, err)
		}
		if st.word != 0 {
			continue
		}
		for r, out := range outs {
			if err := numeric.Check("f32", "sum", out, ins); err != nil {
				t.Errorf("collective %d (%s), rank %d, after other protocols used its slot: %v", e, st.alg, r, err)
			}
		}
	}
}

// allReduceEach runs one f32 sum all-reduce of n elements with a forced
// algorithm on every rank (rank r's input ins[r]) and returns the outputs.
func allReduceEach(comms []*comm.Communicator, alg string, n int, ins [][]byte) ([][]byte, error) {
	outs := make([][]byte, len(comms))
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, cm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := cm.Device()
			buf, err := dev.Alloc(4 * n)
			if err != nil {
				errs[r] = err
				return
			}
			defer dev.Free(buf)
			if err := dev.CopyHtoD(buf, ins[r]); err != nil {
				errs[r] = err
				return
			}
			b := comm.DeviceBuffer(buf)
			if err := cm.AllReduce(b, b, n, "f32", "sum", comm.Options{Algorithm: coll.Algorithm(alg)}); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				return
			}
			outs[r] = make([]byte, 4*n)
			errs[r] = dev.CopyDtoH(outs[r], buf)
		}()
	}
	wg.Wait()
	return outs, errors.Join(errs...)
}
