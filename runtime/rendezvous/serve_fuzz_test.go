package rendezvous

import (
	"bytes"
	"testing"
	"time"
)

// FuzzServeRequests sends any sequence of well-formed request frames, as
// an authenticated client may (a store without a secret takes anyone), to
// a fresh TCP server: every op, flags, a few sequence numbers (so replays
// of one seq with another op or other arguments occur), 0 to 3 arguments
// among a few keys and a value over replayKeep. Each request must get a
// reply (OK, timeout or error: never a hang-up, never a dead server), and
// a client dialled afterwards still sets and gets.
//
// Each request is 4 input bytes: op (1 to 7, 7 unknown), flags (also an
// Add's delta), seq (0 to 3), arguments (count, then 2 bits each).
func FuzzServeRequests(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0x09, 4, 0, 2, 0x03, 2, 0, 3, 0x01})
	// Set a large value, compare-and-set it (not kept: re-read on
	// replay), then replay that seq as a delete without arguments.
	f.Add([]byte{0, 0, 1, 0x22, 4, 0, 2, 0x13, 5, 0, 2, 0x00})
	f.Add([]byte{3, 0, 0, 0x00, 1, 0, 0, 0x03, 2, 0, 0, 0x01, 6, 0xff, 0, 0x02})
	args := [][]byte{[]byte("k"), []byte("5"), bytes.Repeat([]byte("v"), 2*replayKeep), nil}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 4*40 {
			in = in[:4*40]
		}
		srv := newTestServer(t, ServerOptions{Secret: []byte{}, Logf: func(string, ...any) {}})
		c, r := rawConn(t, srv)
		for ; len(in) >= 4; in = in[4:] {
			req := &frame{Op: 1 + in[0]%7, Flags: in[1], Seq: uint64(in[2] % 4)}
			if req.Op == opAdd {
				req.Num = int64(int8(in[1]))
			}
			for i := 0; i < int(in[3]&3); i++ {
				req.Args = append(req.Args, args[(in[3]>>(2+2*i))&3])
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if err := writeFrame(c, req, DefaultMaxFrameSize); err != nil {
				t.Fatalf("send op %d: %v", req.Op, err)
			}
			resp, err := readFrame(r, DefaultMaxFrameSize)
			if err != nil {
				t.Fatalf("op %d seq %d with %d arguments: no reply: %v", req.Op, req.Seq, len(req.Args), err)
			}
			if resp.Op != statusOK && resp.Op != statusTimeout && resp.Op != statusError {
				t.Fatalf("op %d: reply status %d", req.Op, resp.Op)
			}
			if resp.Flags&flagReread != 0 {
				t.Fatalf("op %d: reply carries the replay cache's flagReread", req.Op)
			}
		}
		good := dialTest(t, srv, ClientOptions{Secret: []byte{}})
		ctx := short(t, 5*time.Second)
		if err := good.Set(ctx, "after", []byte("ok")); err != nil {
			t.Fatalf("set after the requests: %v", err)
		}
		if v, err := good.Get(ctx, "after"); err != nil || string(v) != "ok" {
			t.Fatalf("get after the requests: %q, %v", v, err)
		}
	})
}
