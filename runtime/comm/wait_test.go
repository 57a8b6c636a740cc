package comm

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// waitStream returns when the stream is done or its query fails; Abort
// cuts it short without touching NCCL; with NCCL pending, NCCL's
// asynchronous error and the timeout each abort NCCL and end it, and
// without NCCL there is no bound.
func TestWaitStream(t *testing.T) {
	after := func(d time.Duration) func() (bool, error) {
		end := time.Now().Add(d)
		return func() (bool, error) { return time.Now().After(end), nil }
	}
	never := func() (bool, error) { return false, nil }
	no := func() bool { return false }
	type watch struct {
		async   error
		timeout time.Duration
	}
	for _, tc := range []struct {
		name    string
		query   func() (bool, error)
		aborted func() bool
		nccl    *watch
		want    error  // nil: no error
		text    string // in the error
		aborts  bool   // NCCL aborted
	}{
		{"done", after(20 * time.Millisecond), no, &watch{timeout: time.Second}, nil, "", false},
		{"no bound without NCCL", after(50 * time.Millisecond), no, nil, nil, "", false},
		{"query fails", func() (bool, error) { return false, errors.New("fake: illegal address") }, no, nil, nil, "fake: illegal address", false},
		{"aborted", never, func() bool { return true }, &watch{timeout: time.Hour}, ErrAborted, "while waiting for the stream", false},
		{"NCCL's asynchronous error", never, no, &watch{async: errors.New("fake: remote error"), timeout: time.Hour}, ErrAborted, "NCCL failed (a peer died or failed?): fake: remote error", true},
		{"timeout", never, no, &watch{timeout: 30 * time.Millisecond}, ErrTimeout, "fake work did not finish within 30ms", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var aborted atomic.Bool
			var w *ncclWatch
			if tc.nccl != nil {
				w = &ncclWatch{asyncErr: func() error { return tc.nccl.async }, abort: func() { aborted.Store(true) }, timeout: tc.nccl.timeout, what: "fake work"}
			}
			err := waitStream(0, tc.query, tc.aborted, w)
			switch {
			case tc.want == nil && tc.text == "" && err != nil,
				tc.want != nil && !errors.Is(err, tc.want),
				tc.text != "" && (err == nil || !strings.Contains(err.Error(), tc.text)):
				t.Errorf("got %v, want %v containing %q", err, tc.want, tc.text)
			}
			if aborted.Load() != tc.aborts {
				t.Errorf("NCCL aborted %v, want %v", aborted.Load(), tc.aborts)
			}
		})
	}
}

// fakeStream is a queryable whose work is done once done is set, and which
// fails its query once destroyed.
type fakeStream struct{ done, destroyed atomic.Bool }

func (f *fakeStream) Query() (bool, error) {
	if f.destroyed.Load() {
		return false, errors.New("fake: destroyed stream")
	}
	return f.done.Load(), nil
}

// TestPendingNCCL: every stream NCCL work went on stays pending until a
// wait sees it done, not only the last one (a wait on an earlier call's
// stream was unbounded); past maxPendingNCCL the finished and destroyed
// streams are dropped, the busy ones kept.
func TestPendingNCCL(t *testing.T) {
	var p pendingNCCL
	a, b := &fakeStream{}, &fakeStream{}
	p.note(a)
	p.note(b)
	p.note(a) // once only
	if !p.has(a) || !p.has(b) {
		t.Fatalf("after NCCL work on a, then b: has(a) %v, has(b) %v; want both", p.has(a), p.has(b))
	}
	if got := len(p.all()); got != 2 {
		t.Errorf("%d streams pending, want 2", got)
	}
	p.finished(a)
	if p.has(a) || !p.has(b) {
		t.Errorf("after a's wait: has(a) %v, has(b) %v; want false, true", p.has(a), p.has(b))
	}

	var q pendingNCCL
	busy := make([]*fakeStream, maxPendingNCCL/2)
	for i := range maxPendingNCCL {
		f := &fakeStream{}
		switch {
		case i%2 == 0:
			busy[i/2] = f
		case i%4 == 1:
			f.done.Store(true)
		default:
			f.destroyed.Store(true)
		}
		q.note(f)
	}
	last := &fakeStream{}
	q.note(last)
	if got, want := len(q.all()), len(busy)+1; got != want {
		t.Errorf("after %d streams and one more: %d pending, want %d (the busy ones and the new one)", maxPendingNCCL, got, want)
	}
	for i, f := range append(busy, last) {
		if !q.has(f) {
			t.Errorf("busy stream %d dropped", i)
		}
	}
}

// TestDrainStreams: drained waits for every stream, reports a stream still
// busy at the deadline, and counts a failing query (a destroyed stream) as
// ended.
func TestDrainStreams(t *testing.T) {
	done, gone, busy := &fakeStream{}, &fakeStream{}, &fakeStream{}
	done.done.Store(true)
	gone.destroyed.Store(true)
	if !drainStreams(time.Second, done, gone) {
		t.Error("a done and a destroyed stream: not drained")
	}
	start := time.Now()
	if drainStreams(20*time.Millisecond, done, busy) {
		t.Error("a busy stream: drained")
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("a busy stream held drainStreams %v past its 20ms", el)
	}
	go func() { time.Sleep(10 * time.Millisecond); busy.done.Store(true) }()
	if !drainStreams(5*time.Second, gone, busy) {
		t.Error("a stream that finishes within the bound: not drained")
	}
}
