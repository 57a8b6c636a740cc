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
