package comm

import "testing"

// TestHotPathAllocs: after a warm-up call, a staged and a zero-copy
// generated-kernel call allocate nothing on the host (the call record,
// the argument struct and the zero-copy stage pointers are the
// communicator's, reused).
func TestHotPathAllocs(t *testing.T) {
	comms, devs, syms := hotComms(t)
	defer closeAll(t, comms)
	for _, hc := range hotCalls {
		var err error
		allocs := testing.AllocsPerRun(100, func() {
			if e := hc.call(comms[0], syms[0]); e != nil {
				err = e
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", hc.name, err)
		}
		if allocs != 0 {
			t.Errorf("%s call: %v allocations, want 0", hc.name, allocs)
		}
	}
	if devs[0].counted != 2*101 {
		t.Errorf("%d launches, want %d", devs[0].counted, 2*101)
	}
}
