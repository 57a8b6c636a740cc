package ipc

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/fdpass"
)

// FuzzHandoutRequest sends any bytes to a handout (rank 1 of 4), as a
// process of this user may, with "INSTANCE" in them replaced by the
// handout's instance: the reply is JSON holding the handle exactly when the
// bytes are a request for this instance from a peer rank (0, 2 or 3), and
// an error otherwise; an empty or oversized message gets no reply; only
// answered peers are reported served; the handout keeps serving.
func FuzzHandoutRequest(f *testing.F) {
	for _, s := range []string{
		`{"instance":"INSTANCE","rank":0}`, `{"instance":"INSTANCE","rank":1}`, `{"instance":"INSTANCE","rank":4}`,
		`{"instance":"INSTANCE","rank":-1}`, `{"instance":"stale","rank":2}`, `{"instance":"INSTANCE","rank":3,"x":[1]}`,
		`{"instance":"INSTANCE","rank":2.5}`, `{"instance":"INSTANCE","rank":1e0}`, `{"rank":2}`, `null`, `[]`, "\x00not json",
		`{"instance":"INSTANCE","rank":9223372036854775808}`, `{"Instance":"INSTANCE","RANK":2}`, ``,
	} {
		f.Add([]byte(s))
	}
	var (
		once sync.Once
		h    *handout
		herr error
	)
	f.Cleanup(func() {
		if h != nil {
			h.Close()
		}
	})
	f.Fuzz(func(t *testing.T, msg []byte) {
		once.Do(func() { h, herr = newHandout(1, 4, testHandle(), 5*time.Second) })
		if herr != nil {
			t.Fatal(herr)
		}
		msg = bytes.ReplaceAll(msg, []byte("INSTANCE"), []byte(h.instance))
		if len(msg) > fdpass.MaxPayload+16 {
			msg = msg[:fdpass.MaxPayload+16]
		}
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: h.addr(), Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("write %d bytes: %v", len(msg), err)
		}
		buf := make([]byte, fdpass.MaxPayload+1)
		n, err := c.Read(buf)
		if len(msg) == 0 || len(msg) > fdpass.MaxPayload {
			if n != 0 || (err != nil && !errors.Is(err, io.EOF)) {
				t.Fatalf("a %d-byte message got %q, %v; want no reply", len(msg), buf[:n], err)
			}
			return
		}
		if err != nil {
			t.Fatalf("no reply to %q: %v", msg, err)
		}
		var rep handleReply
		if err := json.Unmarshal(buf[:n], &rep); err != nil {
			t.Fatalf("reply %q is not JSON: %v", buf[:n], err)
		}
		var req handleRequest
		jerr := json.Unmarshal(msg, &req)
		valid := jerr == nil && req.Instance == h.instance && req.Rank >= 0 && req.Rank < 4 && req.Rank != 1
		switch {
		case valid && (rep.Err != "" || !bytes.Equal(rep.Handle, testHandle())):
			t.Fatalf("request %q from rank %d: reply %+v; want the handle", msg, req.Rank, rep)
		case !valid && (rep.Err == "" || rep.Handle != nil):
			t.Fatalf("request %q: reply %+v; want an error and no handle", msg, rep)
		case jerr != nil && !strings.HasPrefix(rep.Err, "bad request: "):
			t.Fatalf("request %q (%v): reply %q; want a bad request", msg, jerr, rep.Err)
		}
		if valid {
			// answer records the rank after its reply is sent.
			deadline := time.Now().Add(5 * time.Second)
			for {
				h.mu.Lock()
				given := h.given[req.Rank]
				h.mu.Unlock()
				if given || time.Now().After(deadline) {
					if !given {
						t.Fatalf("rank %d was answered but not recorded as served", req.Rank)
					}
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		for r := range h.given {
			if r < 0 || r >= 4 || r == 1 {
				t.Fatalf("rank %d recorded as served", r)
			}
		}
	})
}
