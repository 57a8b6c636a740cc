package proof

import (
	"errors"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestAbortDuringCloseGPU (reliability case 100): rank 0's Close waits at
// its close barrier for rank 1, which has not closed; Abort from another
// goroutine returns at once and the Close it interrupted returns
// ErrAborted, where both waited out Config.Timeout before. The region
// Abort keeps for rank 1 is freed once rank 1 leaves, and a new group on
// the same GPUs then runs right.
func TestAbortDuringCloseGPU(t *testing.T) {
	w := cudatest.WorldSize(t, 2)
	const timeout = 60 * time.Second
	comms := commsWith(t, w, rendezvous.NewMemStore(), func(int) comm.Config {
		return comm.Config{Group: "abortclose", Timeout: timeout}
	})
	// Kernels and regions in use first, as in a program that closes.
	if err := checkedAllReduce(comms, coll.OneShot, coll.F32, 1024, 3); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- comms[0].Close() }()
	time.Sleep(500 * time.Millisecond)
	stuck := stacksAfter(t, 10*time.Second, "Abort or the Close it interrupted is still blocked 10s after Abort")
	start := time.Now()
	aerr := comms[0].Abort()
	abortTook := time.Since(start)
	var cerr error
	select {
	case cerr = <-closed:
	case <-time.After(15 * time.Second):
		t.Errorf("Close still waiting 15 s after Abort (Config.Timeout %v)", timeout)
		cerr = <-closed
	}
	stuck.Stop()
	closeTook := time.Since(start)
	t.Logf("Abort returned after %v, the interrupted Close after %v: %v", abortTook, closeTook, cerr)
	if abortTook > 5*time.Second {
		t.Errorf("Abort during Close took %v", abortTook)
	}
	if aerr != nil {
		t.Errorf("Abort: %v", aerr)
	}
	if !errors.Is(cerr, comm.ErrAborted) {
		t.Errorf("the interrupted Close: %v; want ErrAborted", cerr)
	}
	for _, c := range comms[1:] {
		c.Abort()
	}
	fresh := commsWith(t, w, rendezvous.NewMemStore(), func(int) comm.Config { return comm.Config{Group: "abortclose"} })
	defer closeComms(fresh)
	if err := checkedAllReduce(fresh, coll.OneShot, coll.F32, 1024, 5); err != nil {
		t.Errorf("a new communicator after Abort during Close: %v", err)
	}
}
