package rendezvous

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// replayBytes is the bytes of values the server's replay cache holds.
func replayBytes(s *Server) (n int) {
	s.mu.Lock()
	clients := make([]*clientState, 0, len(s.clients))
	for _, cs := range s.clients {
		clients = append(clients, cs)
	}
	s.mu.Unlock()
	for _, cs := range clients {
		cs.mu.Lock()
		for _, f := range cs.done {
			for _, a := range f.Args {
				n += len(a)
			}
		}
		cs.mu.Unlock()
	}
	return n
}

// TestTCPReplayCacheHoldsNoLargeValues: failed compare-and-sets of a 2 MiB
// value leave the replay cache holding none of it (200 of them held
// 400 MiB beside MaxStoreBytes), and a compare-and-set whose reply is lost
// still reports, on the client's retry, its outcome and the value.
func TestTCPReplayCacheHoldsNoLargeValues(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, MaxStoreBytes: 4 << 20})
	c := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 20*time.Second)
	big := bytes.Repeat([]byte("v"), 2<<20)
	if err := c.Set(ctx, "k", big); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		cur, swapped, err := c.CompareAndSet(ctx, "k", []byte("x"), []byte("y"))
		if err != nil || swapped || !bytes.Equal(cur, big) {
			t.Fatalf("failing CAS: swapped %v, %d bytes, %v", swapped, len(cur), err)
		}
	}
	if n := replayBytes(srv); n > 64<<10 {
		t.Errorf("the replay cache holds %d bytes of values", n)
	}
	// A lost reply: the retry gets the kept outcome and the value read again.
	drops := 1
	srv.dropReply = func(req *frame) bool {
		if req.Op == opCAS && drops > 0 {
			drops--
			return true
		}
		return false
	}
	nb := bytes.Repeat([]byte("w"), 1<<20)
	cur, swapped, err := c.CompareAndSet(ctx, "k", big, nb)
	srv.dropReply = nil
	if err != nil || !swapped || !bytes.Equal(cur, nb) || drops != 0 {
		t.Errorf("CAS with its reply dropped: swapped %v, %d bytes, %v (drops left %d); want swapped, the new value", swapped, len(cur), err, drops)
	}
}

// TestTCPStalledReaderDropped: a client that asks for a large value and
// never reads the reply is dropped after FrameTimeout, and the in-flight
// budget it held comes back (it held it for good, stalling large frames
// for everyone).
func TestTCPStalledReaderDropped(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, MaxFrameSize: 16 << 20, MaxInflightBytes: 64 << 20, FrameTimeout: 300 * time.Millisecond})
	c := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 20*time.Second)
	if err := c.Set(ctx, "big", make([]byte, 15<<20)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		raw, _ := rawConn(t, srv)
		raw.SetDeadline(time.Now().Add(time.Minute))
		if err := writeFrame(raw, &frame{Op: opGet, Num: 5000, Args: [][]byte{[]byte("big")}}, 1<<20); err != nil {
			t.Fatal(err)
		}
		// ... and never read.
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if used, _ := srv.budget.usage(); used == 0 {
			break
		}
		if time.Now().After(deadline) {
			used, _ := srv.budget.usage()
			t.Fatalf("the budget still holds %d bytes for clients that do not read", used)
		}
	}
	if v, err := c.Get(ctx, "big"); err != nil || len(v) != 15<<20 {
		t.Fatalf("an honest Get of the big value: %d bytes, %v", len(v), err)
	}
}

// TestTCPCloseEndsWait: Close of a TCP client ends its Get waiting for a
// key at once with ErrClosed, as on the other stores (it waited out its
// deadline and then said "timeout").
func TestTCPCloseEndsWait(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}})
	c := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	done := make(chan error, 1)
	go func() {
		_, err := c.Get(short(t, 5*time.Second), "never")
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Get after Close: %v; want ErrClosed", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("Get returned %v after Close", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Get did not return after Close")
	}
}

// TestTCPResponseOverClientLimit: a value larger than the client's
// MaxFrameSize fails at once naming the key and the option (the client
// retried until its deadline).
func TestTCPResponseOverClientLimit(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}})
	w := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 10*time.Second)
	if err := w.Set(ctx, "large", make([]byte, 2<<20)); err != nil {
		t.Fatal(err)
	}
	r := dialTest(t, srv, ClientOptions{Secret: []byte{}, MaxFrameSize: 1 << 20})
	start := time.Now()
	_, err := r.Get(ctx, "large")
	if err == nil || !strings.Contains(err.Error(), `key "large"`) || !strings.Contains(err.Error(), "MaxFrameSize") {
		t.Errorf("Get over the client's limit: %v; want an error naming the key and MaxFrameSize", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("it took %v", d)
	}
}

// TestTCPReplayWithOtherArgs: a request that reuses the (client, seq) of a
// compare-and-set whose large value was not kept, but with no arguments,
// is answered (with an error: a retry must repeat its request) and the
// server goes on serving.
func TestTCPReplayWithOtherArgs(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}})
	c, r := rawConn(t, srv)
	big := bytes.Repeat([]byte("v"), 2*replayKeep)
	for _, f := range []*frame{
		{Op: opSet, Seq: 1, Args: [][]byte{[]byte("k"), big}},
		{Op: opCAS, Seq: 2, Args: [][]byte{[]byte("k"), []byte("other"), []byte("new")}},
	} {
		if err := writeFrame(c, f, 1<<20); err != nil {
			t.Fatal(err)
		}
		if resp, err := readFrame(r, 1<<20); err != nil || resp.Op != statusOK {
			t.Fatalf("op %d: %+v, %v", f.Op, resp, err)
		}
	}
	for _, op := range []uint8{opDelete, opCAS, opSet} {
		if err := writeFrame(c, &frame{Op: op, Seq: 2}, 1<<20); err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		resp, err := readFrame(r, 1<<20)
		if err != nil || resp.Op != statusError {
			t.Fatalf("replay of seq 2 as op %d without arguments: %+v, %v; want an error reply", op, resp, err)
		}
	}
	good := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	if v, err := good.Get(short(t, 5*time.Second), "k"); err != nil || !bytes.Equal(v, big) {
		t.Fatalf("after the replays: %d bytes, %v", len(v), err)
	}
}
