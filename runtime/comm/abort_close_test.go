package comm

import (
	"errors"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestAbortDuringClose: Abort "stops the communicator now, from any
// goroutine, without waiting for peers". A Close on another goroutine
// that waits at its close barrier for a peer that has not closed yet held
// Abort (and itself) until Config.Timeout. Now Abort returns promptly,
// the Close it interrupted returns ErrAborted at once, and the staging
// region stays while the peer is still in the group (as after Abort), so
// a peer's kernel never reads freed memory; it goes once the peer leaves.
func TestAbortDuringClose(t *testing.T) {
	const timeout = 8 * time.Second
	comms, devs := regCommsWith(t, rendezvous.NewMemStore(), Config{Group: "AC", Timeout: timeout}, 2, &eventLog{}, nil)
	closed := make(chan error, 1)
	go func() { closed <- comms[0].Close() }() // rank 1 never closes: the barrier waits for it
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	aerr := comms[0].Abort()
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Abort during Close took %v (Config.Timeout %v); want it prompt", took.Round(time.Millisecond), timeout)
	}
	select {
	case err := <-closed:
		if !errors.Is(err, ErrAborted) {
			t.Errorf("the interrupted Close: %v; want ErrAborted", err)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("Close still waiting 2 s after Abort")
		<-closed
	}
	if aerr != nil {
		t.Errorf("Abort: %v", aerr)
	}
	if err := comms[0].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 1, coll.F32, coll.Sum, Options{}); !errors.Is(err, ErrAborted) {
		t.Errorf("call after Abort: %v; want ErrAborted", err)
	}
	devs[0].mu.Lock()
	freed := devs[0].regionFreed
	devs[0].mu.Unlock()
	if freed == nil {
		t.Fatal("the region was freed with the peer still in the group (or never kept)")
	}
	select {
	case <-freed:
		t.Fatal("the region was freed with the peer still in the group")
	case <-time.After(300 * time.Millisecond):
	}
	if err := comms[1].Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-freed:
	case <-time.After(5 * time.Second):
		t.Error("region not freed 5 s after every rank left")
	}
}
