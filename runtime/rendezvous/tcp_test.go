package rendezvous

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestTCPListensOnLoopbackByDefault(t *testing.T) {
	srv, err := NewTCPServer(":0", ServerOptions{Secret: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !strings.HasPrefix(srv.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr = %s, want 127.0.0.1:port", srv.Addr())
	}
}

func TestTCPAuth(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte("s3cret")})
	ctx := short(t, 2*time.Second)

	for _, secret := range []string{"", "wrong"} {
		_, err := DialTCP(ctx, srv.Addr(), ClientOptions{Secret: []byte(secret)})
		want := "rendezvous: authentication failed: tcp store at " + srv.Addr() + " refused this client; give the store and every rank the same COLLGEN_STORE_SECRET"
		if fmt.Sprint(err) != want || !errors.Is(err, ErrAuth) {
			t.Fatalf("secret %q: got %v\nwant %s", secret, err, want)
		}
	}

	// The env variable is the fallback for a nil secret, on both sides.
	t.Setenv(EnvSecret, "s3cret")
	s := dialTest(t, srv, ClientOptions{})
	if err := s.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

func TestTCPServerRefusesOversizeFrame(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, MaxFrameSize: 1024})
	// Client allows big frames so the server is the one that refuses.
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}, MaxFrameSize: 1 << 20})
	err := s.Set(short(t, 2*time.Second), "big", make([]byte, 4096))
	if want := "rendezvous: frame too large: 4137 bytes exceeds the 1024-byte limit; store smaller values"; fmt.Sprint(err) != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	// The server keeps serving others.
	s2 := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	if err := s2.Set(short(t, 2*time.Second), "small", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	// A client refuses to send over its own limit without retrying.
	s3 := dialTest(t, srv, ClientOptions{Secret: []byte{}, MaxFrameSize: 100})
	err = s3.Set(short(t, 2*time.Second), "big", make([]byte, 200))
	if want := "rendezvous: frame too large: 241 bytes exceeds the 100-byte limit; store smaller values"; fmt.Sprint(err) != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}

// rawConn connects and authenticates by hand, for sending hostile bytes.
func rawConn(t *testing.T, srv *Server) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if _, err := readFrame(r, 1024); err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(c, &frame{Op: opAuth, Args: [][]byte{nil}}, 1024); err != nil {
		t.Fatal(err)
	}
	if f, err := readFrame(r, 1024); err != nil || f.Op != statusOK {
		t.Fatalf("auth: %v %v", f, err)
	}
	return c, r
}

func TestTCPBadFramesDisconnectOnlyTheSender(t *testing.T) {
	var logs atomic.Int32
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, Logf: func(f string, a ...any) {
		logs.Add(1)
		t.Logf(f, a...)
	}})
	good := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 5*time.Second)
	if err := good.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}

	hostile := map[string][]byte{
		"huge length":   {0xff, 0xff, 0xff, 0xff},
		"short payload": {0, 0, 0, 3, 1, 2, 3},
		"lying nargs":   append([]byte{0, 0, 0, 30}, append(make([]byte, 26), 0xff, 0xff, 0xff, 0xff)...),
		"lying arg len": func() []byte {
			b := appendFrame(nil, &frame{Op: opSet, Args: [][]byte{[]byte("k"), []byte("v")}})
			binary.BigEndian.PutUint32(b[4+payloadHeader:], 1000)
			return b
		}(),
	}
	for name, b := range hostile {
		t.Run(name, func(t *testing.T) {
			c, r := rawConn(t, srv)
			c.Write(b)
			if _, err := r.ReadByte(); err == nil {
				t.Fatal("server answered a malformed frame instead of hanging up")
			}
		})
	}
	// Garbage instead of a handshake.
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.Write(bytes.Repeat([]byte{0xde, 0xad}, 100))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).Discard(1 << 20); err == nil {
		t.Fatal("server kept a garbage handshake open")
	}
	c.Close()

	// Unknown op: an error reply, connection kept.
	c2, r2 := rawConn(t, srv)
	writeFrame(c2, &frame{Op: 77}, 1024)
	if f, err := readFrame(r2, 1024); err != nil || f.Op != statusError || string(f.Args[0]) != "unknown op 77" {
		t.Fatalf("unknown op: %+v, %v", f, err)
	}

	if v, err := good.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("good client after hostile ones: %q, %v", v, err)
	}
	if logs.Load() == 0 {
		t.Fatal("server logged no dropped client")
	}
}

func TestTCPHandshakeTimeout(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, HandshakeTimeout: 50 * time.Millisecond})
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	readFrame(r, 1024) // the challenge; then say nothing
	_, err = r.ReadByte()
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("silent client not dropped: %v", err)
	}
}

// TestTCPHangUpDuringHandshakeIsQuiet: a client that connects and goes
// away before answering the challenge (a rank exiting while a connection
// opens; closed plainly or reset) is an ordinary hang-up the server does
// not log, while a torn reply still is.
func TestTCPHangUpDuringHandshakeIsQuiet(t *testing.T) {
	var mu sync.Mutex
	var logged []string
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, Logf: func(format string, args ...any) {
		mu.Lock()
		logged = append(logged, fmt.Sprintf(format, args...))
		mu.Unlock()
	}})
	hangUp := func(reset, torn bool) {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if reset {
			c.(*net.TCPConn).SetLinger(0) // close with a reset, the challenge unread
		} else {
			readFrame(bufio.NewReader(c), 1024)
		}
		if torn {
			c.Write([]byte{0, 0, 0, 9, 1}) // a 9-byte frame cut after one byte
		}
		c.Close()
	}
	hangUp(false, false)
	hangUp(true, false)
	// Every connection has been served once a client's request succeeds
	// after them (the server handles each on its own goroutine; wait a
	// little for the log).
	good := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	if err := good.Set(short(t, 5*time.Second), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	quiet := slices.Clone(logged)
	mu.Unlock()
	if len(quiet) != 0 {
		t.Errorf("hang-ups during the handshake logged: %q", quiet)
	}
	hangUp(false, true)
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(logged)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a torn handshake reply was not logged")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTCPReconnect(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}})
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 5*time.Second)
	if err := s.Set(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	srv.dropConnections()
	if v, err := s.Get(ctx, "a"); err != nil || string(v) != "1" {
		t.Fatalf("Get after drop: %q, %v", v, err)
	}

	// A wait in flight survives a drop: it reconnects and keeps waiting.
	done := make(chan error, 1)
	go func() { done <- s.Wait(ctx, "later") }()
	time.Sleep(50 * time.Millisecond)
	srv.dropConnections()
	time.Sleep(50 * time.Millisecond)
	other := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	other.Set(ctx, "later", nil)
	if err := <-done; err != nil {
		t.Fatalf("Wait across a drop: %v", err)
	}
}

func TestTCPReplayedAddAppliesOnce(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}})
	var drops atomic.Int32
	srv.dropReply = func(req *frame) bool {
		// Lose the reply to the first attempt of each Add and CAS.
		return (req.Op == opAdd || req.Op == opCAS) && drops.Add(1)%2 == 1
	}
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 5*time.Second)
	for i := int64(1); i <= 3; i++ {
		n, err := s.Add(ctx, "n", 10)
		if err != nil || n != 10*i {
			t.Fatalf("Add #%d = %d, %v; want %d", i, n, err, 10*i)
		}
	}
	cur, ok, err := s.CompareAndSet(ctx, "c", nil, []byte("x"))
	if err != nil || !ok || string(cur) != "x" {
		t.Fatalf("replayed CAS = %q, %v, %v; want x, true (the first answer)", cur, ok, err)
	}
	if drops.Load() != 8 {
		t.Fatalf("%d attempts, want 8 (every op tried twice)", drops.Load())
	}
}

func TestTCPUnreachable(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	_, err := DialTCP(short(t, 150*time.Millisecond), "tcp://"+addr, ClientOptions{})
	if err == nil || !strings.HasPrefix(err.Error(), "rendezvous: tcp store at "+addr+" unreachable: ") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
}

func TestTCPDialWaitsForLateServer(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	go func() {
		time.Sleep(100 * time.Millisecond)
		srv, err := NewTCPServer(addr, ServerOptions{Secret: []byte{}})
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { srv.Close() })
	}()
	s, err := DialTCP(short(t, 3*time.Second), addr, ClientOptions{Secret: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestTCPServerCloseEndsWaits(t *testing.T) {
	srv, err := NewTCPServer("127.0.0.1:0", ServerOptions{Secret: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	done := make(chan error, 1)
	go func() { done <- s.Wait(short(t, 400*time.Millisecond), "never") }()
	time.Sleep(50 * time.Millisecond)
	srv.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Wait succeeded on a closed server")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not end after the server closed")
	}
}

func TestTCPCancelAbortsWait(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}})
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	go func() { time.Sleep(30 * time.Millisecond); cancel() }()
	start := time.Now()
	err := s.Wait(ctx, "never")
	if !errors.Is(err, context.Canceled) || time.Since(start) > 2*time.Second {
		t.Fatalf("Wait after cancel = %v after %v", err, time.Since(start))
	}
}
