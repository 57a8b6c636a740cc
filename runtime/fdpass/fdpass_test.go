//go:build linux

package fdpass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
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
	srv := ln.Serve(5*time.Second, func(c *Conn) {
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
