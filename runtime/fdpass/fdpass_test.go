//go:build linux

package fdpass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/fdpass/fdpasstest"
)

func TestCheckPeer(t *testing.T) {
	if err := CheckPeer(Cred{PID: 7, UID: 1000}, 1000); err != nil {
		t.Fatalf("same uid refused: %v", err)
	}
	for _, uid := range []int{0, 1001} {
		err := CheckPeer(Cred{PID: 7, UID: uid}, 1000)
		if !errors.Is(err, ErrForeignUser) {
			t.Fatalf("uid %d accepted for uid 1000: %v", uid, err)
		}
		if !strings.Contains(err.Error(), "pid 7") {
			t.Errorf("error does not name the peer's pid: %v", err)
		}
	}
	// Root gets no exemption either way.
	if err := CheckPeer(Cred{UID: 1000}, 0); !errors.Is(err, ErrForeignUser) {
		t.Errorf("uid 1000 accepted by root: %v", err)
	}
}

// pair returns a connected, checked listener-side and dial-side Conn.
func pair(t *testing.T) (srv, cli *Conn) {
	t.Helper()
	ln, err := Listen("collgen-fdpass-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err = Dial(ctx, ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.c.Close(); cli.Close() })
	return r.c, cli
}

func TestSendRecvFiles(t *testing.T) {
	srv, cli := pair(t)
	if got := srv.Peer(); got.PID != os.Getpid() || got.UID != os.Geteuid() {
		t.Errorf("peer credentials %+v, want pid %d uid %d", got, os.Getpid(), os.Geteuid())
	}
	f, err := os.CreateTemp(t.TempDir(), "fd")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("through the socket"); err != nil {
		t.Fatal(err)
	}
	if err := cli.Send([]byte("hello"), f); err != nil {
		t.Fatal(err)
	}
	payload, files, err := srv.Recv(1)
	if err != nil {
		t.Fatal(err)
	}
	if string(payload) != "hello" || len(files) != 1 {
		t.Fatalf("got %q with %d files", payload, len(files))
	}
	defer files[0].Close()
	var a, b syscall.Stat_t
	syscall.Fstat(int(f.Fd()), &a)
	syscall.Fstat(int(files[0].Fd()), &b)
	if a.Ino != b.Ino || a.Dev != b.Dev {
		t.Errorf("received descriptor is another file (inode %d, want %d)", b.Ino, a.Ino)
	}
	flags, err := fcntl(int(files[0].Fd()), syscall.F_GETFD)
	if err != nil || flags&syscall.FD_CLOEXEC == 0 {
		t.Errorf("received descriptor is not close-on-exec (flags %#x, %v)", flags, err)
	}
}

func fcntl(fd, cmd int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func TestRecvRefusesExtraFiles(t *testing.T) {
	srv, cli := pair(t)
	before := openFDs(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Send([]byte("two"), r, w); err != nil {
		t.Fatal(err)
	}
	r.Close()
	w.Close()
	if _, files, err := srv.Recv(1); err == nil || files != nil {
		t.Fatalf("two descriptors accepted where one was asked for: %v, %d files", err, len(files))
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after a refused message, %d before", after, before)
	}
}

func TestRecvEOF(t *testing.T) {
	srv, cli := pair(t)
	cli.Close()
	if _, _, err := srv.Recv(0); err != io.EOF {
		t.Fatalf("got %v, want io.EOF", err)
	}
}

func TestSendLimits(t *testing.T) {
	_, cli := pair(t)
	if err := cli.Send(nil); err == nil {
		t.Error("empty payload sent")
	}
	if err := cli.Send(make([]byte, MaxPayload+1)); err == nil {
		t.Error("oversized payload sent")
	}
}

func TestDialNoListener(t *testing.T) {
	ln, err := Listen("collgen-fdpass-test-")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Dial(ctx, addr); err == nil {
		t.Fatal("dialled a closed listener: the abstract name outlived it")
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept on a closed listener: %v, want net.ErrClosed", err)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// envDial makes the test binary, re-executed, dial the address it holds
// and report the outcome on stdout instead of running tests.
const envDial = "FDPASS_TEST_DIAL"

func TestMain(m *testing.M) {
	if addr := os.Getenv(envDial); addr != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := Dial(ctx, addr)
		if err == nil {
			c.Close()
			fmt.Println("dialled")
			os.Exit(0)
		}
		fmt.Println(err)
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// TestForeignUserRefused connects from a process of another user (the
// test binary re-executed as nobody, which needs root): both ends refuse
// the connection.
func TestForeignUserRefused(t *testing.T) {
	cmd := fdpasstest.AsNobody(t, []string{"-test.run=^$"})
	ln, err := Listen("collgen-fdpass-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	cmd.Env = append(cmd.Env, envDial+"="+ln.Addr())
	out, err := cmd.Output()
	if err == nil || !strings.Contains(string(out), "another user") {
		t.Errorf("the foreign process: %v: %s; want its Dial to refuse a listener of uid 0", err, out)
	}
	select {
	case err := <-accepted:
		if !errors.Is(err, ErrForeignUser) || !strings.Contains(err.Error(), fmt.Sprintf("uid %d", fdpasstest.Nobody)) {
			t.Errorf("Accept: %v; want ErrForeignUser naming uid %d", err, fdpasstest.Nobody)
		}
	case <-time.After(time.Minute):
		t.Fatal("Accept never saw the foreign connection")
	}
}

// TestServer: every connection reaches the handler with a deadline set and
// is closed after it; Close closes connections whose handlers still wait,
// waits for every handler, releases the name, and is idempotent.
func TestServer(t *testing.T) {
	ln, err := Listen("collgen-fdpass-test-")
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	waiting := make(chan struct{}, 1)
	srv, err := ln.Serve(5*time.Second, func(c *Conn) {
		defer handled.Add(1)
		b, _, err := c.Recv(0)
		if err != nil {
			return
		}
		if string(b) == "wait" {
			waiting <- struct{}{}
			c.Recv(0) // until the client sends again or Close closes c
			return
		}
		c.Send(append([]byte("echo "), b...))
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 3 {
		c, err := Dial(ctx, srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprint("hello ", i)
		if err := c.Send([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		got, _, err := c.Recv(0)
		if err != nil || string(got) != "echo "+msg {
			t.Fatalf("reply %q, %v; want %q", got, err, "echo "+msg)
		}
		// The server closes its end after the handler returns.
		if _, _, err := c.Recv(0); err != io.EOF {
			t.Errorf("after the reply: %v; want io.EOF", err)
		}
		c.Close()
	}
	held, err := Dial(ctx, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	held.Send([]byte("wait"))
	<-waiting
	start := time.Now()
	if err := srv.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close with a handler waiting took %v; want it to close the connection", d)
	}
	if n := handled.Load(); n != 4 {
		t.Errorf("%d handlers returned by Close; want all 4", n)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if c, err := Dial(ctx, srv.Addr()); err == nil {
		c.Close()
		t.Error("Dial after Close succeeded")
	}
}

// settled waits up to 5 s for the goroutine count to fall to want and
// returns the last count (goroutines that just returned may linger an
// instant).
func settled(want int) int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(5 * time.Second); n > want && time.Now().Before(deadline); n = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

// TestServeRefusesBadArguments: Serve refuses, up front and wrapping
// ErrInvalidArgument with a message naming the argument, a nil, zero,
// closed or already served listener, a nil handler and a timeout that is
// not positive; nothing starts (no goroutine, no descriptor), and a
// refused listener stays the caller's, still usable. (Before, Serve
// started an accept loop for all of them: a nil or zero listener and a nil
// handler panicked in its goroutine, killing the process; a closed one
// served nothing, silently; a second Serve shared the listener between two
// Servers; a timeout of 0 or less gave every connection a deadline already
// past.)
func TestServeRefusesBadArguments(t *testing.T) {
	handle := func(*Conn) {}
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)
	open := func(t *testing.T) *Listener {
		ln, err := Listen("collgen-fdpass-test-")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	for _, tc := range []struct {
		name    string
		ln      func(t *testing.T) *Listener
		timeout time.Duration
		handle  func(*Conn)
		want    string
	}{
		{"nil listener", func(*testing.T) *Listener { return nil }, time.Second, handle, "nil Listener"},
		{"zero listener", func(*testing.T) *Listener { return &Listener{} }, time.Second, handle, "nil Listener"},
		{"closed listener", func(t *testing.T) *Listener { ln := open(t); ln.Close(); return ln }, time.Second, handle, "listener is closed"},
		{"served listener", func(t *testing.T) *Listener {
			ln := open(t)
			srv, err := ln.Serve(time.Second, handle)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			return ln
		}, time.Second, handle, "already served"},
		{"nil handler", open, time.Second, nil, "nil handler"},
		{"zero timeout", open, 0, handle, "timeout 0s"},
		{"negative timeout", open, -time.Second, handle, "timeout -1s"},
		{"most negative timeout", open, math.MinInt64, handle, "timeout -2562047h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := tc.ln(t)
			before := runtime.NumGoroutine()
			srv, err := ln.Serve(tc.timeout, tc.handle)
			if srv != nil || !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				if srv != nil {
					srv.Close()
				}
				t.Fatalf("Serve: %v, %v; want ErrInvalidArgument saying %q", srv, err, tc.want)
			}
			if n := settled(before); n > before {
				t.Errorf("%d goroutines after the refusal, %d before", n, before)
			}
			if ln == nil || ln.ln == nil || ln.closed.Load() || tc.name == "served listener" {
				return
			}
			// Still the caller's: it accepts, and Close releases it.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err == nil {
					c.Close()
				}
				done <- err
			}()
			c, err := Dial(ctx, ln.Addr())
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			if err := <-done; err != nil {
				t.Errorf("Accept on the refused listener: %v", err)
			}
			if err := ln.Close(); err != nil {
				t.Errorf("Close of the refused listener: %v", err)
			}
		})
	}
	if n := settled(goroutines); n > goroutines {
		t.Errorf("%d goroutines left, %d before", n, goroutines)
	}
	if n := openFDs(t); n != fds {
		t.Errorf("%d descriptors open after the refusals, %d before", n, fds)
	}
}

// TestArgumentErrors: every refusal of an argument by Listen, Dial, Send,
// Recv and a nil Conn wraps ErrInvalidArgument and names the value (they
// were untyped errors, and a nil Conn, context or file panicked or failed
// in the kernel with EBADF), and sends nothing.
func TestArgumentErrors(t *testing.T) {
	srv, cli := pair(t)
	closedFile, err := os.CreateTemp(t.TempDir(), "closed")
	if err != nil {
		t.Fatal(err)
	}
	closedFile.Close()
	files := make([]*os.File, MaxFiles+1)
	for i := range files {
		files[i] = os.Stdin
	}
	var nilConn *Conn
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"long prefix", func() error { _, err := Listen(strings.Repeat("p", MaxPrefix+1)); return err }(), "prefix of 92 bytes: at most 91"},
		{"nil context", func() error { _, err := Dial(nil, "@x"); return err }(), "nil context"},
		{"empty payload", cli.Send(nil), "payload of 0 bytes"},
		{"large payload", cli.Send(make([]byte, MaxPayload+1)), fmt.Sprintf("payload of %d bytes", MaxPayload+1)},
		{"too many files", cli.Send([]byte("x"), files...), fmt.Sprintf("%d descriptors", MaxFiles+1)},
		{"nil file", cli.Send([]byte("x"), os.Stdin, nil), "file 1 of 2 is nil"},
		{"closed file", cli.Send([]byte("x"), closedFile), "file 0 of 1 (" + closedFile.Name() + ") is closed"},
		{"negative maxFiles", func() error { _, _, err := srv.Recv(-1); return err }(), "maxFiles -1"},
		{"large maxFiles", func() error { _, _, err := srv.Recv(MaxFiles + 1); return err }(), fmt.Sprintf("maxFiles %d", MaxFiles+1)},
		{"nil conn send", nilConn.Send([]byte("x")), "Send on a nil Conn"},
		{"nil conn recv", func() error { _, _, err := nilConn.Recv(0); return err }(), "Recv on a nil Conn"},
		{"nil conn deadline", nilConn.SetDeadline(time.Now()), "SetDeadline on a nil Conn"},
		{"nil conn close", nilConn.Close(), "Close on a nil Conn"},
		{"zero conn", (&Conn{}).Send([]byte("x")), "Send on a nil Conn"},
		{"nil listener accept", func() error { _, err := (*Listener)(nil).Accept(); return err }(), "Accept on a nil Listener"},
		{"nil listener close", (*Listener)(nil).Close(), "Close on a nil Listener"},
	} {
		if !errors.Is(tc.err, ErrInvalidArgument) || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrInvalidArgument saying %q", tc.name, tc.err, tc.want)
		}
	}
	// Nothing was sent: the next message is the first the receiver gets.
	if err := cli.Send([]byte("first")); err != nil {
		t.Fatal(err)
	}
	srv.SetDeadline(time.Now().Add(5 * time.Second))
	if got, files, err := srv.Recv(0); err != nil || string(got) != "first" || len(files) != 0 {
		t.Errorf("after the refusals the receiver got %q, %d files, %v; want \"first\"", got, len(files), err)
	}
}
