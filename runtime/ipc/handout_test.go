package ipc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/fdpass/fdpasstest"
)

// Set in the re-executed child of TestHandoutRefusesOtherUsers: the address
// and instance to ask, as "addr instance".
const envForeignAsk = "COLLGEN_IPC_TEST_FOREIGN_ASK"

func testHandle() []byte {
	h := make([]byte, 64)
	for i := range h {
		h[i] = byte(i * 7)
	}
	return h
}

// TestHandout: a rank's handout gives its handle to each peer that asks
// with the published instance, refuses stale instances and non-peers (not
// counting them as served), reports who has collected, and closes cleanly
// with a connection still open.
func TestHandout(t *testing.T) {
	h, err := newHandout(0, 3, testHandle(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !strings.HasPrefix(h.addr(), "@collgen-ipc-") {
		t.Errorf("socket %q: want an abstract name starting with @collgen-ipc-", h.addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, c := range []struct {
		instance string
		rank     int
		want     string
	}{
		{"stale", 1, "another group's"},
		{h.instance, 0, "not a peer of rank 0"},
		{h.instance, 3, "not a peer of rank 0"},
		{h.instance, -1, "not a peer of rank 0"},
	} {
		if _, err := fetchHandle(ctx, h.addr(), c.instance, c.rank); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ask %q as rank %d: %v; want an error containing %q", c.instance, c.rank, err, c.want)
		}
	}
	// Refused requests are not collections.
	short, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = h.waitServed(short, map[int]bool{1: true, 2: true})
	scancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ranks [1 2] of other processes never collected") {
		t.Errorf("waitServed before any collection: %v; want a deadline error naming ranks [1 2]", err)
	}

	got, err := fetchHandle(ctx, h.addr(), h.instance, 1)
	if err != nil || !bytes.Equal(got, testHandle()) {
		t.Fatalf("rank 1's fetch: %x, %v; want the handle", got, err)
	}
	short, scancel = context.WithTimeout(ctx, 50*time.Millisecond)
	err = h.waitServed(short, map[int]bool{1: true, 2: true})
	scancel()
	if err == nil || !strings.Contains(err.Error(), "ranks [2] ") {
		t.Errorf("waitServed with rank 1 served: %v; want rank 2 named alone", err)
	}
	// A second fetch by the same rank is answered and counted once.
	if _, err := fetchHandle(ctx, h.addr(), h.instance, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := fetchHandle(ctx, h.addr(), h.instance, 2); err != nil {
		t.Fatal(err)
	}
	if err := h.waitServed(ctx, map[int]bool{1: true, 2: true}); err != nil {
		t.Errorf("waitServed with both served: %v", err)
	}
	if err := h.waitServed(ctx, nil); err != nil {
		t.Errorf("waitServed of no ranks: %v", err)
	}

	// A connection that never asks is closed by Close, which returns
	// promptly and leaves the name free.
	idle, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: h.addr(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	time.Sleep(20 * time.Millisecond) // let serve accept it
	start := time.Now()
	if err := h.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close with an idle connection took %v", d)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := fetchHandle(ctx, h.addr(), h.instance, 1); err == nil {
		t.Error("fetch after Close succeeded")
	}
}

// TestHandoutBadRequest: garbage on the socket is answered with an error,
// and the handout goes on serving.
func TestHandoutBadRequest(t *testing.T) {
	h, err := newHandout(1, 2, testHandle(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: h.addr(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("\x00not json"))
	buf := make([]byte, 4096)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	c.Close()
	var rep handleReply
	if err != nil || json.Unmarshal(buf[:n], &rep) != nil || !strings.Contains(rep.Err, "bad request") || rep.Handle != nil {
		t.Errorf("reply to garbage: %q, %v; want a bad-request error and no handle", buf[:n], err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := fetchHandle(ctx, h.addr(), h.instance, 0); err != nil || !bytes.Equal(got, testHandle()) {
		t.Errorf("fetch after garbage: %v", err)
	}
}

// TestHandoutRefusesOtherUsers: a process of another user that skips its
// own check and asks with the right instance gets no handle, and is not
// counted as served (needs root to start a process as nobody).
func TestHandoutRefusesOtherUsers(t *testing.T) {
	if ask := os.Getenv(envForeignAsk); ask != "" {
		addr, instance, _ := strings.Cut(ask, " ")
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: addr, Net: "unixpacket"})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		req, _ := json.Marshal(handleRequest{Instance: instance, Rank: 1})
		c.Write(req)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		if n > 0 {
			t.Fatalf("foreign process got %q", buf[:n])
		}
		t.Logf("foreign read: %d bytes, %v", n, err)
		return
	}
	h, err := newHandout(0, 2, testHandle(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	cmd := fdpasstest.AsNobody(t, []string{"-test.run=^TestHandoutRefusesOtherUsers$", "-test.v"},
		envForeignAsk+"="+h.addr()+" "+h.instance)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "foreign read: 0 bytes") {
		t.Errorf("the foreign process: %v:\n%s\nwant it to read nothing", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := h.waitServed(ctx, map[int]bool{1: true}); err == nil {
		t.Error("the foreign request counted as rank 1's collection")
	}
}
