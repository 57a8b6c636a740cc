//go:build linux && (amd64 || arm64)

package comm

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// Abort from another goroutine while a GPU call waits in the debug
// check's exchange for a peer that never issues it: Abort waited for the
// call to give up at Config.Timeout (it holds busy), and the call then
// returned ErrTimeout, not ErrAborted. Now Abort ends the exchange at
// once. (Close waits for a GPU call in flight, as without the debug
// check: TestDebugCheckCloseRacingCall.)
func TestAbortEndsDebugCheckWait(t *testing.T) {
	t.Setenv(EnvDebugCheck, "1")
	const timeout = 5 * time.Second
	for _, end := range []string{"Abort"} {
		t.Run(end, func(t *testing.T) {
			comms, _ := fakeComms(t, 2, Config{Timeout: timeout})
			defer comms[1].Abort() // rank 1 never calls
			c := comms[0]
			res := make(chan error, 1)
			go func() {
				res <- c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 64, coll.F32, coll.Sum, Options{})
			}()
			time.Sleep(100 * time.Millisecond) // the call waits for rank 1's fingerprint
			start := time.Now()
			want := ErrAborted
			if end == "Abort" {
				within(t, 2*time.Second, "Abort", c.Abort)
			} else {
				want = ErrClosed
				go c.Close() // collective: waits for rank 1 at the close barrier
			}
			select {
			case err := <-res:
				if !errors.Is(err, want) {
					t.Errorf("the waiting call: %v, want %v", err, want)
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("the waiting call still waits 2 s after %s", end)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("%s ended the call after %v", end, el)
			}
			if end == "Close" {
				c.Abort()
			}
		})
	}
}

// UseSymmetric waits for every rank's record; a rank that never calls it
// kept the caller waiting for ever when its ctx had no deadline
// (Config.Timeout bounds every wait for a peer), holding busy, so Abort
// and Close waited for ever too. Now the wait ends at Config.Timeout
// (ErrTimeout naming the rank), and at once on Abort (ErrAborted).
func TestUseSymmetricWaitBounded(t *testing.T) {
	const timeout = 300 * time.Millisecond
	t.Run("timeout", func(t *testing.T) {
		comms, _ := fakeComms(t, 2, Config{Timeout: timeout})
		// In a goroutine: before the fix, Abort waited for the call.
		defer func() { go onRanks(comms, func(_ int, c *Communicator) error { return c.Abort() }) }()
		pools := hostPools(t, "ut", 2)
		start := time.Now()
		err := within(t, 5*time.Second, "UseSymmetric", func() error { return comms[0].UseSymmetric(context.Background(), pools[0]) })
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "missing rank 1") {
			t.Errorf("UseSymmetric with rank 1 absent: %v, want ErrTimeout naming rank 1", err)
		}
		if el := time.Since(start); el < timeout {
			t.Errorf("gave up after %v, before Config.Timeout %v", el, timeout)
		}
	})
	t.Run("abort", func(t *testing.T) {
		comms, _ := fakeComms(t, 2, Config{Timeout: 10 * time.Second})
		defer comms[1].Abort()
		pools := hostPools(t, "ua", 2)
		res := make(chan error, 1)
		go func() { res <- comms[0].UseSymmetric(context.Background(), pools[0]) }()
		time.Sleep(100 * time.Millisecond)
		within(t, 2*time.Second, "Abort during UseSymmetric", comms[0].Abort)
		select {
		case err := <-res:
			if !errors.Is(err, ErrAborted) {
				t.Errorf("UseSymmetric interrupted by Abort: %v, want ErrAborted", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("UseSymmetric still waits 2 s after Abort")
		}
	})
}

// gateStore holds the first Add of key until release is closed, after
// signalling entered.
type gateStore struct {
	rendezvous.Store
	key              string
	once             sync.Once
	entered, release chan struct{}
}

func (s *gateStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if key == s.key {
		held := false
		s.once.Do(func() { held = true })
		if held {
			close(s.entered)
			<-s.release
		}
	}
	return s.Store.Add(ctx, key, delta)
}

// A host call whose debug-check exchange runs while its communicator and
// the peer's close (a goroutine issuing calls, another closing): host
// calls do not hold busy, so the exchange went on after the last rank's
// Close had forgotten the group's keys, and wrote its generation counter
// and fingerprint after it: 2 keys on the store after every rank closed
// (case 74's rule). Now Close ends the exchange and waits for it before
// leaving the group.
func TestHostDebugCheckRacingCloseLeavesNoKeys(t *testing.T) {
	t.Setenv(EnvDebugCheck, "1")
	keys := storetest.NewKeyStore(rendezvous.NewMemStore())
	st := &gateStore{Store: keys, entered: make(chan struct{}), release: make(chan struct{})}
	comms := hostComms(t, st, 2, "hdc", func(c *Config) { c.Timeout = 2 * time.Second })
	st.key = comms[0].prefix + "check/gen/0" // rendezvous.AllGather's counter, under collgen/allgather/
	st.key = "collgen/allgather/" + st.key
	res := make(chan error, 1)
	go func() {
		in := make([]float32, 64)
		res <- comms[0].AllReduce(HostSlice(in), HostSlice(in), 64, coll.F32, coll.Sum, Options{})
	}()
	<-st.entered // rank 0's call is in its exchange
	closed := make(chan error, 2)
	for _, c := range comms {
		go func() { closed <- c.Close() }()
	}
	time.Sleep(200 * time.Millisecond) // the Closes run (before the fix: both finish)
	close(st.release)
	for range comms {
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("Close still waits 5 s later")
		}
	}
	if err := <-res; !errors.Is(err, ErrClosed) && !errors.Is(err, ErrTimeout) {
		t.Errorf("the call racing Close: %v, want ErrClosed", err)
	}
	if left := keys.Live(); len(left) > 0 {
		t.Errorf("%d keys left after every rank closed: %q", len(left), left)
	}
}
