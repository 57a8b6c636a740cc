//go:build linux && (amd64 || arm64)

package comm

import (
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
)

// TestDebugCheckCloseRacingCall: Close waits for a GPU call in
// flight on another goroutine (busy) and the call completes with its
// peers. The debug check is a cross-check; it must not change that
// outcome. Since Close began to end store exchanges at once (exchange),
// a call in the debug check's exchange when Close starts returns
// ErrClosed though its peer issues the call, and the peer waits for a
// fingerprint that never comes (ErrTimeout at Config.Timeout).
func TestDebugCheckCloseRacingCall(t *testing.T) {
	for _, check := range []string{"0", "1"} {
		t.Run("check="+check, func(t *testing.T) {
			t.Setenv(EnvDebugCheck, check)
			comms, _ := fakeComms(t, 2, Config{Timeout: 3 * time.Second})
			call := func(c *Communicator) error {
				return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 64, coll.F32, coll.Sum, Options{})
			}
			res := make([]chan error, 2)
			closed := make([]chan error, 2)
			for r := range res {
				res[r], closed[r] = make(chan error, 1), make(chan error, 1)
			}
			go func() { res[0] <- call(comms[0]) }()
			time.Sleep(100 * time.Millisecond) // rank 0's call waits for rank 1
			go func() { closed[0] <- comms[0].Close() }()
			time.Sleep(100 * time.Millisecond)
			go func() { // rank 1: the call, then Close, in order
				res[1] <- call(comms[1])
				closed[1] <- comms[1].Close()
			}()
			for r := range res {
				if err := <-res[r]; err != nil {
					t.Errorf("rank %d's call: %v; want it to complete, as Close waits for it", r, err)
				}
			}
			for r := range closed {
				<-closed[r]
			}
		})
	}
}
