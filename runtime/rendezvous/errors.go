package rendezvous

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultTimeout bounds every wait whose ctx has no deadline.
const DefaultTimeout = 5 * time.Minute

// WithDefaultTimeout returns ctx, or ctx bounded by d (DefaultTimeout when
// d <= 0) when ctx has no deadline: the bound every store's waits have.
func WithDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	if d <= 0 {
		d = DefaultTimeout
	}
	return context.WithTimeout(ctx, d)
}

// WaitError is returned by Store.Wait and Store.Get when the deadline passes
// before every key exists. It wraps ErrTimeout.
type WaitError struct {
	// Missing lists the keys that did not exist at the deadline, in the
	// order they were asked for.
	Missing []string
}

// Error reads `rendezvous: timeout waiting for keys "a", "c"`.
func (e *WaitError) Error() string {
	q := make([]string, len(e.Missing))
	for i, k := range e.Missing {
		q[i] = strconv.Quote(k)
	}
	noun := "key"
	if len(q) > 1 {
		noun = "keys"
	}
	return fmt.Sprintf("rendezvous: timeout waiting for %s %s", noun, strings.Join(q, ", "))
}

// Unwrap makes errors.Is(err, ErrTimeout) true.
func (e *WaitError) Unwrap() error { return ErrTimeout }

// MissingRanksError is returned by Join, Barrier and AllGather when the
// deadline passes before every rank arrives. It wraps ErrTimeout and reads
// "rendezvous: 3/4 ranks joined after 30s; missing rank 2".
type MissingRanksError struct {
	// Joined ranks had arrived, of World.
	Joined, World int
	// After is how long the caller waited (the ctx timeout it was given).
	After time.Duration
	// Missing holds the ranks that had not arrived, ascending.
	Missing []int
}

// Error reads "rendezvous: 3/4 ranks joined after 30s; missing rank 2" (or
// "missing ranks 1, 2").
func (e *MissingRanksError) Error() string {
	s := make([]string, len(e.Missing))
	for i, r := range e.Missing {
		s[i] = strconv.Itoa(r)
	}
	noun := "rank"
	if len(s) > 1 {
		noun = "ranks"
	}
	return fmt.Sprintf("rendezvous: %d/%d ranks joined after %v; missing %s %s",
		e.Joined, e.World, roundWait(e.After), noun, strings.Join(s, ", "))
}

// Unwrap makes errors.Is(err, ErrTimeout) true.
func (e *MissingRanksError) Unwrap() error { return ErrTimeout }

// roundWait turns the time left when a wait began back into the timeout a
// person configured: a little always passes between making the ctx and
// measuring it, so round up (to 1ms below 10ms, 10ms below 1s, else 100ms).
func roundWait(d time.Duration) time.Duration {
	g := 100 * time.Millisecond
	switch {
	case d < 10*time.Millisecond:
		g = time.Millisecond
	case d < time.Second:
		g = 10 * time.Millisecond
	}
	return (d + g - 1).Truncate(g)
}

// CauseErr is ctx.Err() with the cancellation's cause appended when there is
// a different one, so a wait stopped by a signal (signal.NotifyContext's
// cause, "terminated signal received") or by a caller's
// context.WithCancelCause says so instead of only "context canceled". It
// still wraps ctx.Err() for errors.Is.
func CauseErr(ctx context.Context) error {
	err := ctx.Err()
	if c := context.Cause(ctx); c != nil && c != err {
		return fmt.Errorf("%w (%v)", err, c)
	}
	return err
}
