package rendezvous

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestTCPFloodDoesNotStarveRendezvous: 1,100 unauthenticated connections
// that never answer the challenge (more than MaxConns), plus a flooder that
// keeps opening more, must not delay a real 4-rank rendezvous until the
// flood's handshakes time out (30s here); and the server's log stays
// rate-limited (the old server logged one line per refusal).
func TestTCPFloodDoesNotStarveRendezvous(t *testing.T) {
	var lines atomic.Int32
	srv := newTestServer(t, ServerOptions{Secret: []byte("s3cret"), HandshakeTimeout: 30 * time.Second,
		Logf: func(f string, a ...any) { lines.Add(1) }})
	start := time.Now()
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 1100 {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatalf("flood dial: %v", err)
		}
		flood = append(flood, c)
	}
	// A flooder that keeps 100 more connections churning meanwhile.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ring [100]net.Conn
		for i := 0; ; i++ {
			select {
			case <-stop:
				for _, c := range ring {
					if c != nil {
						c.Close()
					}
				}
				return
			default:
			}
			if c := ring[i%len(ring)]; c != nil {
				c.Close()
			}
			ring[i%len(ring)], _ = net.Dial("tcp", srv.Addr())
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	const world = 4
	ctx := short(t, 60*time.Second)
	began := time.Now()
	errs := make(chan error, world)
	for r := range world {
		go func() {
			s, err := DialTCP(ctx, srv.Addr(), ClientOptions{Secret: []byte("s3cret")})
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			errs <- Join(ctx, s, "flooded", r, world)
		}()
	}
	for range world {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(began)
	t.Logf("rendezvous under a flood of %d connections took %v", len(flood), took)
	// The flood's handshakes time out after 30s; a rendezvous that waited
	// for them would take that long. 15s leaves a loaded machine room.
	if took > 15*time.Second {
		t.Fatalf("rendezvous took %v under the flood", took)
	}
	// Logging: a burst of 10, then 2 lines a second, plus slack.
	elapsed := time.Since(start).Seconds()
	if max := 10 + int32(2*elapsed) + 3; lines.Load() > max {
		t.Fatalf("%d log lines in %.1fs, want at most %d", lines.Load(), elapsed, max)
	}
	t.Logf("%d log lines", lines.Load())
	if lines.Load() == 0 {
		t.Fatal("the server logged nothing about the flood")
	}
}

// TestRateLogger counts lines directly: 1,000 events in a burst give the
// burst, and the next line after a pause reports the rest as suppressed.
func TestRateLogger(t *testing.T) {
	var got []string
	l := rateLogger{logf: func(f string, a ...any) { got = append(got, fmt.Sprintf(f, a...)) }, burst: 10, every: time.Hour}
	for i := range 1000 {
		l.printf("event %d", i)
	}
	if len(got) != 10 {
		t.Fatalf("%d lines for 1000 events, want 10", len(got))
	}
	l.every = time.Nanosecond // the next event finds a token
	l.printf("later")
	if last := got[len(got)-1]; last != "later (990 similar lines suppressed)" {
		t.Fatalf("last line %q", last)
	}
}

// TestTCPLargeFramesBounded: clients announcing large frames and trickling
// them can hold at most MaxInflightBytes of server memory, ordinary small
// requests keep being served meanwhile, and the tricklers are dropped after
// FrameTimeout, returning the budget.
func TestTCPLargeFramesBounded(t *testing.T) {
	const frameMax, budget = 1 << 20, 2 << 20
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, MaxFrameSize: frameMax, MaxInflightBytes: budget,
		FrameTimeout: 500 * time.Millisecond})
	var readers []*bufio.Reader
	for range 8 {
		c, r := rawConn(t, srv)
		c.SetDeadline(time.Now().Add(60 * time.Second)) // the server must hang up well before
		hdr := binary.BigEndian.AppendUint32(nil, frameMax)
		c.Write(append(hdr, make([]byte, 100)...)) // then stall
		readers = append(readers, r)
	}
	// Ordinary traffic is not stalled by the held budget.
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 10*time.Second)
	if err := s.Set(ctx, "small", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, peak := srv.budget.usage(); peak > budget {
		t.Fatalf("peak in-flight %d bytes, budget %d", peak, budget)
	}
	// Every trickler is dropped (the first two after FrameTimeout, the
	// rest once admitted and timed out in turn).
	for i, r := range readers {
		_, err := r.ReadByte()
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("trickler %d: %v, want the server to hang up", i, err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if used, _ := srv.budget.usage(); used == 0 {
			break
		}
		if time.Now().After(deadline) {
			used, _ := srv.budget.usage()
			t.Fatalf("budget still holds %d bytes after the tricklers left", used)
		}
	}
	// Whole large frames from many clients at once all succeed, and the
	// server never holds more than the budget of them.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dialTest(t, srv, ClientOptions{Secret: []byte{}})
			errs <- c.Set(ctx, fmt.Sprintf("big%d", i), make([]byte, frameMax-100))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, peak := srv.budget.usage(); peak > budget {
		t.Fatalf("peak in-flight %d bytes, budget %d", peak, budget)
	}
}

// TestTCPIdleTimeout: an authenticated connection with nothing in flight
// is closed after IdleTimeout; one blocked in a long wait is not.
func TestTCPIdleTimeout(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, IdleTimeout: 200 * time.Millisecond})
	_, qr := rawConn(t, srv)
	start := time.Now()
	if _, err := qr.ReadByte(); err == nil {
		t.Fatal("idle connection got data")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("idle connection closed after %v", d)
	}
	busy, br := rawConn(t, srv)
	writeFrame(busy, &frame{Op: opWait, Num: 1000, Args: [][]byte{[]byte("never")}}, 1024)
	f, err := readFrame(br, 1024)
	if err != nil || f.Op != statusTimeout {
		t.Fatalf("a 1s wait under a 200ms idle timeout: %+v, %v; want its timeout reply", f, err)
	}
	// And the client-side store reconnects after an idle close.
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 5*time.Second)
	if err := s.Set(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if v, err := s.Get(ctx, "a"); err != nil || string(v) != "1" {
		t.Fatalf("after an idle close: %q, %v", v, err)
	}
}

// TestTCPHandshakeEvictionConverges: 32 honest ranks connecting at once to
// a server that lets only 4 authenticate at a time evict one another's
// handshakes, retry, and all join.
func TestTCPHandshakeEvictionConverges(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte("s"), MaxHandshakes: 4, Logf: func(string, ...any) {}})
	const world = 32
	ctx := short(t, 60*time.Second)
	errs := make(chan error, world)
	for r := range world {
		go func() {
			s, err := DialTCP(ctx, srv.Addr(), ClientOptions{Secret: []byte("s")})
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			errs <- Join(ctx, s, "burst", r, world)
		}()
	}
	for range world {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdmitEvictsPerPeerThenOldest: a remote peer over its handshake limit
// evicts its own oldest handshake, not another peer's; a full table evicts
// the oldest overall; loopback peers are limited only by the table.
func TestAdmitEvictsPerPeerThenOldest(t *testing.T) {
	s := &Server{opts: ServerOptions{MaxHandshakes: 4, MaxHandshakesPerPeer: 2}}
	conn := func(peer string) *connState {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return &connState{c: a, peer: peer}
	}
	a1, b1, a2, a3 := conn("10.0.0.1"), conn("10.0.0.2"), conn("10.0.0.1"), conn("10.0.0.1")
	for _, c := range []*connState{a1, b1, a2, a3} {
		s.admitLocked(c)
	}
	if !a1.evicted || b1.evicted || a2.evicted || a3.evicted || len(s.pending) != 3 {
		t.Fatalf("per-peer: evicted a1=%v b1=%v a2=%v a3=%v, %d pending", a1.evicted, b1.evicted, a2.evicted, a3.evicted, len(s.pending))
	}
	l1, l2 := conn(""), conn("")
	s.admitLocked(l1) // 4 pending: full
	s.admitLocked(l2) // evicts the oldest overall: b1
	if !b1.evicted || l1.evicted || l2.evicted || len(s.pending) != 4 {
		t.Fatalf("global: evicted b1=%v l1=%v l2=%v, %d pending", b1.evicted, l1.evicted, l2.evicted, len(s.pending))
	}
}

// TestTCPStoreSizeBounded: values past MaxStoreBytes are refused with a
// message naming the limit; overwriting and deleting give the room back.
func TestTCPStoreSizeBounded(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, MaxStoreBytes: 1 << 20})
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 10*time.Second)
	big := make([]byte, 600<<10)
	if err := s.Set(ctx, "a", big); err != nil {
		t.Fatal(err)
	}
	err := s.Set(ctx, "b", big)
	if err == nil || !strings.Contains(err.Error(), "store full") || !strings.Contains(err.Error(), "1048576-byte limit") {
		t.Fatalf("second 600 KiB value: %v, want a store-full error", err)
	}
	if _, err := s.Get(short(t, 100*time.Millisecond), "b"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("the refused value was stored: %v", err)
	}
	if err := s.Set(ctx, "a", []byte("small")); err != nil { // overwrite frees room
		t.Fatal(err)
	}
	if err := s.Set(ctx, "b", big); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "c", big); err != nil {
		t.Fatal(err)
	}
	// The in-memory store has no limit unless told; the same accounting
	// types the error there.
	m := newMemStore(time.Second)
	m.limit = 10
	if err := m.Set(ctx, "k", []byte("0123456789")); !errors.Is(err, ErrStoreFull) {
		t.Fatalf("mem store past its limit: %v", err)
	}
	if _, err := m.Add(ctx, "n", 1); err != nil { // "n" + "1" fits
		t.Fatal(err)
	}
	if _, _, err := m.CompareAndSet(ctx, "n", []byte("1"), []byte("0123456789")); !errors.Is(err, ErrStoreFull) {
		t.Fatalf("CAS past the limit: %v", err)
	}
}

// TestTCPRandomFramesServerSurvives sends random bytes, and random frames
// with plausible headers, on authenticated connections: each one is either
// answered or hung up on, never hangs the server, and a well-behaved client
// keeps working throughout.
func TestTCPRandomFramesServerSurvives(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, MaxFrameSize: 4096, FrameTimeout: time.Second, Logf: func(string, ...any) {}})
	good := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 30*time.Second)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 100 {
		c, r := rawConn(t, srv)
		var b []byte
		if i%2 == 0 {
			b = make([]byte, rng.IntN(200))
			for j := range b {
				b[j] = byte(rng.IntN(256))
			}
		} else {
			f := &frame{Op: uint8(rng.IntN(8)), Flags: uint8(rng.IntN(16)), Seq: rng.Uint64(), Num: int64(rng.IntN(50))}
			for range rng.IntN(4) {
				a := make([]byte, rng.IntN(40))
				for j := range a {
					a[j] = byte(rng.IntN(256))
				}
				f.Args = append(f.Args, a)
			}
			b = appendFrame(nil, f)
			if len(b) > 8 && rng.IntN(3) == 0 { // corrupt a length
				binary.BigEndian.PutUint32(b[4+payloadHeader-4:], rng.Uint32())
			}
		}
		c.Write(b)
		c.(*net.TCPConn).CloseWrite()
		// Answered or hung up on: either way the read ends (the raw
		// connection's own 5 s deadline would be a failure).
		if _, err := io.ReadAll(r); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("input %d (%d bytes): the server neither answered nor hung up", i, len(b))
			}
		}
		c.Close()
		if i%20 == 0 {
			if err := good.Set(ctx, "k", []byte{byte(i)}); err != nil {
				t.Fatalf("good client after input %d: %v", i, err)
			}
		}
	}
	if v, err := good.Get(ctx, "k"); err != nil || len(v) != 1 {
		t.Fatalf("good client at the end: %q, %v", v, err)
	}
}
