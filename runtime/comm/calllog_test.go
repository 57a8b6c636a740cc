package comm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
)

// diagnoseFor sets diagnoseWait for one test.
func diagnoseFor(t *testing.T, d time.Duration) {
	t.Helper()
	was := diagnoseWait
	diagnoseWait = d
	t.Cleanup(func() { diagnoseWait = was })
}

// timeoutWord is the status word of a barrier timeout of kernel 0 in which
// kernel rank waited for kernel rank peer.
func timeoutWord(rank, peer int) uint64 {
	return 1<<32 | 2<<24 | uint64(peer)<<16 | uint64(rank)<<8 | 1 // CG_STATUS_TIMEOUT
}

// calls makes an account of n all-reduces of 64 f32 from call first on.
func calls(first int64, n int) callAccount {
	a := callAccount{First: first}
	for range n {
		a.Calls = append(a.Calls, fingerprint{Collective: "allreduce", Count: 64, DType: "f32", Op: "sum", Requested: "auto", Resolved: "oneshot", ZeroCopy: -1})
	}
	return a
}

// explain names the first call two accounts hold that differs, else which
// rank issued more, else that they agree; only calls both still hold are
// compared.
func TestExplain(t *testing.T) {
	differ := calls(1, 5)
	differ.Calls[3].ZeroCopy = 4096
	refused := calls(1, 3)
	refused.Calls[2].Err = "comm: allreduce: the input is DeviceBuffer(0)"
	closed := calls(1, 2)
	closed.Ended = "closed"
	older := calls(1, 64) // a call before the window of the other differs: not seen
	older.Calls[0].Count = 8
	for _, tc := range []struct {
		name          string
		mine, theirs  callAccount
		want, without []string
	}{
		{"a different call", calls(1, 5), differ, []string{"rank 1 issued a different call 4:", "zero-copy at offset 4096, where this rank issued allreduce of 64 f32 sum"}, nil},
		{"a refused call", calls(1, 3), refused, []string{"different call 3", "refused: comm: allreduce: the input is DeviceBuffer(0)"}, nil},
		{"behind", calls(1, 5), calls(1, 3), []string{"rank 1's latest call is 3, allreduce of 64 f32", "this rank is at call 5: rank 1 has not issued call 4 (allreduce"}, []string{"closed"}},
		{"behind and closed", calls(1, 3), closed, []string{"latest call is 2", "it then closed its communicator", "has not issued call 3"}, nil},
		{"none issued", calls(1, 1), calls(1, 0), []string{"rank 1 has issued no collective; this rank is at call 1: rank 1 has not issued call 1 (allreduce"}, nil},
		{"behind beyond the window", calls(101, 64), calls(1, 40), []string{"latest call is 40", "has not issued call 41"}, []string{"(allreduce of 64 f32 sum, algorithm auto (runs oneshot) here)"}},
		{"ahead", calls(1, 3), calls(1, 5), []string{"rank 1 has issued 5 calls and this rank 3, the same ones up to call 3"}, nil},
		{"the same", calls(1, 4), calls(1, 4), []string{"rank 1 issued the same calls as this rank, up to call 4", "not a different collective"}, nil},
		{"none at all", calls(1, 0), calls(1, 0), []string{"neither this rank nor rank 1 has issued a collective"}, nil},
		{"outside the window", calls(10, 55), older, []string{"the same calls as this rank, up to call 64"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, same := explain(1, tc.mine, tc.theirs)
			if want := strings.Contains(tc.name, "same") || tc.name == "none at all" || tc.name == "outside the window"; same != want {
				t.Errorf("explain says same %v, want %v: %s", same, want, got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("explain: %q\nwant it to contain %q", got, w)
				}
			}
			for _, w := range tc.without {
				if strings.Contains(got, w) {
					t.Errorf("explain: %q\nwant it without %q", got, w)
				}
			}
		})
	}
}

// The log keeps the latest callLogLen calls in order.
func TestCallLogKeepsTheLatest(t *testing.T) {
	var l callLog
	if a := l.account(); a.First != 1 || len(a.Calls) != 0 || a.last() != 0 {
		t.Fatalf("empty log: %+v", a)
	}
	for i := range 100 {
		l.add(fingerprint{Count: int64(i + 1)})
	}
	a := l.account()
	if a.First != 100-callLogLen+1 || a.last() != 100 {
		t.Fatalf("first %d, last %d; want %d and 100", a.First, a.last(), 100-callLogLen+1)
	}
	for i := a.First; i <= a.last(); i++ {
		if f, ok := a.at(i); !ok || f.Count != i {
			t.Fatalf("call %d: %+v %v", i, f, ok)
		}
	}
	if _, ok := a.at(a.First - 1); ok {
		t.Errorf("the log holds a call it dropped")
	}
}

// A rank whose kernel times out asks the peer it waited for what it
// issued, and the error says how the calls differ: here a count that
// differs (ranks 0 and 1 each time out waiting for the other), and a
// call the peer refused and then closed.
func TestTimeoutNamesTheCallThatDiffers(t *testing.T) {
	diagnoseFor(t, 5*time.Second)
	t.Run("counts differ", func(t *testing.T) {
		comms, devs := fakeComms(t, 2, Config{})
		defer closeAll(t, comms)
		errs := onRanks(comms, func(r int, c *Communicator) error {
			return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 64*(r+1), coll.F32, coll.Sum, Options{})
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		devs[0].statusVal, devs[1].statusVal = timeoutWord(0, 1), timeoutWord(1, 0)
		errs = onRanks(comms, func(r int, c *Communicator) error { return c.Err() })
		for r, err := range errs {
			var te *TimeoutError
			want := []string{"rank 1 issued a different call 1: allreduce of 128 f32 sum", "where this rank issued allreduce of 64 f32 sum"}
			if r == 1 {
				want = []string{"rank 0 issued a different call 1: allreduce of 64 f32 sum", "where this rank issued allreduce of 128 f32 sum"}
			}
			if !errors.As(err, &te) || te.Peer != 1-r {
				t.Fatalf("rank %d: %v", r, err)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("rank %d: %v\nwant it to contain %q", r, err, w)
				}
			}
		}
	})
	t.Run("refused, then closed", func(t *testing.T) {
		comms, devs := fakeComms(t, 2, Config{})
		errs := onRanks(comms, func(r int, c *Communicator) error {
			in := DeviceBuffer(0x1000)
			if r == 1 {
				in = DeviceBuffer(0)
			}
			return c.AllReduce(in, DeviceBuffer(0x9000), 64, coll.F32, coll.Sum, Options{})
		})
		if errs[0] != nil || !errors.Is(errs[1], ErrInvalidArgument) {
			t.Fatalf("errors %v", errs)
		}
		devs[0].statusVal = timeoutWord(0, 1)
		closed := make(chan error)
		go func() { closed <- comms[1].Close() }()
		err := comms[0].Err()
		for _, w := range []string{"rank 1 issued a different call 1", "refused: comm: allreduce: the input is DeviceBuffer(0)", "it then closed its communicator"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v\nwant it to contain %q", err, w)
			}
		}
		if err := errors.Join(comms[0].Close(), <-closed); err != nil {
			t.Error(err)
		}
	})
}

// An NCCL collective past Config.Timeout names no peer: the rank asks every
// other rank and names those whose calls differ (here rank 2, which
// issued another count and closed), or says that all issued the same.
func TestNCCLTimeoutAsksEveryRank(t *testing.T) {
	diagnoseFor(t, 5*time.Second)
	ncclTimeout := errorf(ErrTimeout, "fake: an NCCL collective did not finish")
	t.Run("one differs", func(t *testing.T) {
		comms, devs := fakeComms(t, 3, Config{})
		devs[0].syncErr, devs[1].syncErr = ncclTimeout, ncclTimeout
		calls := make([]error, 3)
		closes := onRanks(comms, func(r int, c *Communicator) error {
			n := 64
			if r == 2 {
				n = 128
			}
			calls[r] = c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), n, coll.F32, coll.Sum, Options{Algorithm: coll.NCCL})
			devs[r].mu.Lock()
			devs[r].syncErr = nil // Close waits for the stream too
			devs[r].mu.Unlock()
			return c.Close()
		})
		if err := errors.Join(append(closes, calls[2])...); err != nil {
			t.Fatal(err)
		}
		for r := range 2 {
			err := calls[r]
			want := "fake: an NCCL collective did not finish; rank 2 issued a different call 1: allreduce of 128 f32 sum, algorithm nccl (runs nccl), where this rank issued allreduce of 64 f32 sum, algorithm nccl (runs nccl); it then closed its communicator"
			if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), fmt.Sprintf("rank %d ", 1-r)) {
				t.Errorf("rank %d: %v\nwant %q, and nothing of rank %d", r, err, want, 1-r)
			}
		}
	})
	t.Run("one silent", func(t *testing.T) {
		diagnoseFor(t, 200*time.Millisecond)
		comms, devs := fakeComms(t, 3, Config{})
		defer closeAll(t, comms)
		devs[0].syncErr, devs[1].syncErr = ncclTimeout, ncclTimeout
		errs := onRanks(comms[:2], func(r int, c *Communicator) error {
			return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 64, coll.F32, coll.Sum, Options{Algorithm: coll.NCCL})
		})
		for r, err := range errs {
			if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "; rank 2 gave no account of its calls within 200ms") || strings.Contains(err.Error(), fmt.Sprintf("rank %d ", 1-r)) {
				t.Errorf("rank %d: %v", r, err)
			}
		}
		for _, d := range devs {
			d.syncErr = nil // Close waits for the stream too
		}
	})
	t.Run("all the same", func(t *testing.T) {
		comms, devs := fakeComms(t, 3, Config{})
		defer closeAll(t, comms)
		for _, d := range devs {
			d.syncErr = ncclTimeout
		}
		errs := onRanks(comms, func(r int, c *Communicator) error {
			return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 64, coll.F32, coll.Sum, Options{Algorithm: coll.NCCL})
		})
		for r, err := range errs {
			if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "every rank issued the same calls as this rank, up to call 1") {
				t.Errorf("rank %d: %v", r, err)
			}
		}
		for _, d := range devs {
			d.syncErr = nil // Close waits for the stream too
		}
	})
}

// At world 3, rank 0 waits for rank 1, which issued the same calls and
// itself waits for rank 2, whose count differs: rank 0 asks every rank and
// names rank 2.
func TestTimeoutAsksEveryRankWhenThePeerAgrees(t *testing.T) {
	diagnoseFor(t, 5*time.Second)
	comms, devs := fakeComms(t, 3, Config{})
	defer closeAll(t, comms)
	errs := onRanks(comms, func(r int, c *Communicator) error {
		n := 64
		if r == 2 {
			n = 128
		}
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), n, coll.F32, coll.Sum, Options{})
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	devs[0].statusVal, devs[1].statusVal, devs[2].statusVal = timeoutWord(0, 1), timeoutWord(1, 2), timeoutWord(2, 0)
	errs = onRanks(comms, func(r int, c *Communicator) error { return c.Err() })
	want := "rank 1 issued the same calls as this rank, up to call 1"
	also := "; asked every rank: rank 2 issued a different call 1: allreduce of 128 f32 sum"
	if err := errs[0]; !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), also) {
		t.Errorf("rank 0: %v\nwant %q and %q", err, want, also)
	}
	if err := errs[1]; !strings.Contains(err.Error(), "rank 2 issued a different call 1") || strings.Contains(err.Error(), "asked every rank") {
		t.Errorf("rank 1: %v", err)
	}
}

// A peer that aborted after its first call: the rank whose second call
// timed out says so.
func TestTimeoutNamesAnAbortedPeer(t *testing.T) {
	diagnoseFor(t, 5*time.Second)
	comms, devs := fakeComms(t, 2, Config{})
	defer comms[0].Abort() // rank 1 meets no close barrier
	errs := onRanks(comms, func(r int, c *Communicator) error {
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 64, coll.F32, coll.Sum, Options{})
	})
	if err := errors.Join(append(errs, comms[1].Abort())...); err != nil {
		t.Fatal(err)
	}
	devs[0].statusVal = timeoutWord(0, 1)
	err := comms[0].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 64, coll.F32, coll.Sum, Options{})
	want := "rank 1's latest call is 1, allreduce of 64 f32 sum, algorithm auto (runs oneshot_ll); it then aborted its communicator; this rank is at call 2: rank 1 has not issued call 2"
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), want) {
		t.Errorf("%v\nwant it to contain %q", err, want)
	}
}

// A peer that never answers costs diagnoseWait and is named; Abort cuts
// the wait short; and where no answer came, the error is the timeout all
// the same.
func TestTimeoutDiagnoseBounded(t *testing.T) {
	t.Run("no answer", func(t *testing.T) {
		diagnoseFor(t, 100*time.Millisecond)
		comms, devs := fakeComms(t, 2, Config{})
		defer closeAll(t, comms)
		devs[0].statusVal = timeoutWord(0, 1)
		err := comms[0].Err()
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "rank 1 gave no account of its calls within 100ms") {
			t.Errorf("%v", err)
		}
	})
	t.Run("abort", func(t *testing.T) {
		diagnoseFor(t, time.Minute)
		comms, devs := fakeComms(t, 2, Config{})
		devs[0].statusVal = timeoutWord(0, 1)
		start := time.Now()
		done := make(chan error)
		go func() { done <- comms[0].Err() }()
		time.Sleep(100 * time.Millisecond)
		if err := comms[0].Abort(); err != nil {
			t.Error(err)
		}
		err := <-done
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("Err took %v after Abort", took)
		}
		if !errors.Is(err, ErrAborted) && !errors.Is(err, ErrTimeout) {
			t.Errorf("%v", err)
		}
		if err := comms[1].Abort(); err != nil {
			t.Error(err)
		}
	})
}

// Every rank's account is forgotten when the group is gone.
func TestCallAccountsForgotten(t *testing.T) {
	diagnoseFor(t, 100*time.Millisecond)
	comms, devs := fakeComms(t, 2, Config{})
	store := comms[0].cfg.Store
	prefix := comms[0].prefix
	devs[0].statusVal = timeoutWord(0, 1)
	if err := comms[0].Err(); !errors.Is(err, ErrTimeout) {
		t.Fatal(err)
	}
	closeAll(t, comms)
	for r := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := store.Get(ctx, callsKey(prefix, r))
		cancel()
		if err == nil {
			t.Errorf("rank %d's account is still in the store", r)
		}
	}
}
