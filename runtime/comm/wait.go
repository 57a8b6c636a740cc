package comm

import (
	"slices"
	"sync"
	"time"

	"github.com/collgen/collgen/internal/pause"
)

// Polling of waitStream: spin on the query for spinFor (a collective of up
// to 200 µs ends there, seen as soon as cuStreamSynchronize, which spins
// too), then sleep 10 µs doubling up to maxSleep, a millisecond once the
// wait has lasted 10 ms (pause.Backoff; time.Sleep would last a
// millisecond however short); NCCL's asynchronous error is read every
// asyncEvery.
const (
	spinFor    = 200 * time.Microsecond
	maxSleep   = 50 * time.Microsecond
	asyncEvery = time.Millisecond
)

// ncclWatch is what waitStream needs where NCCL work is pending on the
// stream: NCCL kernels have no deadline of their own, so the wait is
// bounded by timeout, and NCCL's asynchronous error (a peer that failed)
// ends it; either way abort (ncclCommAbort) stops the NCCL kernels.
type ncclWatch struct {
	asyncErr func() error
	abort    func()
	timeout  time.Duration
	// what names the NCCL work in the timeout's message.
	what string
}

// waitStream waits until query (cuStreamQuery) reports the stream done,
// the way cuStreamSynchronize would, but it can be cut short: once aborted
// reports true (Communicator.Abort) it returns ErrAborted; with nccl set,
// NCCL's asynchronous error aborts NCCL and returns ErrAborted, and past
// nccl.timeout NCCL is aborted and the error is ErrTimeout. Without nccl
// the wait is unbounded: generated kernels bound themselves.
func waitStream(rank int, query func() (bool, error), aborted func() bool, nccl *ncclWatch) error {
	start := time.Now()
	nextAsync := start.Add(asyncEvery)
	pace := pause.Backoff{Spin: spinFor, Max: maxSleep}
	for {
		done, err := query()
		if err != nil || done {
			return err
		}
		if aborted() {
			return errorf(ErrAborted, "comm: rank %d: aborted (Communicator.Abort) while waiting for the stream", rank)
		}
		if nccl != nil {
			now := time.Now()
			if now.After(nextAsync) {
				nextAsync = now.Add(asyncEvery)
				if aerr := nccl.asyncErr(); aerr != nil {
					nccl.abort()
					return errorf(ErrAborted, "comm: rank %d: NCCL failed (a peer died or failed?): %w; the NCCL communicator was aborted, make a new Communicator", rank, aerr)
				}
			}
			if now.Sub(start) > nccl.timeout {
				nccl.abort()
				return errorf(ErrTimeout, "comm: rank %d: %s did not finish within %v (Config.Timeout): a peer is dead, stalled or issuing a different collective; the NCCL communicator was aborted, make a new Communicator", rank, nccl.what, nccl.timeout)
			}
		}
		pace.Wait()
	}
}

// queryable is a stream as pendingNCCL sees it (*cuda.Stream; a fake in
// tests): Query reports whether its work is done, and fails once the
// stream is destroyed.
type queryable interface {
	Query() (bool, error)
}

// maxPendingNCCL is how many streams pendingNCCL holds before it drops the
// finished ones.
const maxPendingNCCL = 16

// pendingNCCL is the set of streams NCCL work was enqueued on that no wait
// of the communicator has since seen finish. A wait on any of them is
// bounded by Config.Timeout (NCCL kernels have no deadline of their own)
// and Abort drains them all, however many streams the caller spreads its
// NCCL work over; remembering only the last one left a wait on an earlier
// call's stream unbounded. A caller that waits for its streams elsewhere
// (cuStreamSynchronize of its own) never clears them here, so past
// maxPendingNCCL streams the finished and destroyed ones are dropped. Safe
// for concurrent use.
type pendingNCCL struct {
	mu      sync.Mutex
	streams []queryable
}

// note records NCCL work enqueued on s.
func (p *pendingNCCL) note(s queryable) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if slices.Contains(p.streams, s) {
		return
	}
	if len(p.streams) >= maxPendingNCCL {
		p.streams = slices.DeleteFunc(p.streams, func(q queryable) bool {
			done, err := q.Query()
			return done || err != nil
		})
	}
	p.streams = append(p.streams, s)
}

// waitFor waits for s (waitStream): where NCCL work on s may be
// unfinished, bounded as watch says (nil: no NCCL, nothing bounded); s is
// forgotten once a wait has seen it done, so the caller may destroy it.
func (p *pendingNCCL) waitFor(rank int, s queryable, aborted func() bool, watch *ncclWatch) error {
	pending := watch != nil && p.has(s)
	if !pending {
		watch = nil
	}
	if err := waitStream(rank, s.Query, aborted, watch); err != nil {
		return err
	}
	if pending {
		p.finished(s)
	}
	return nil
}

// has reports whether NCCL work on s may be unfinished.
func (p *pendingNCCL) has(s queryable) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.streams, s)
}

// finished forgets s after a wait saw it done (the caller may destroy it).
func (p *pendingNCCL) finished(s queryable) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.streams = slices.DeleteFunc(p.streams, func(q queryable) bool { return q == s })
}

// all returns a copy of the streams, for draining.
func (p *pendingNCCL) all() []queryable {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.streams)
}

// drainStreams polls each stream until it is done or fails, for up to
// timeout in all, reporting whether every one ended.
func drainStreams(timeout time.Duration, streams ...queryable) bool {
	deadline := time.Now().Add(timeout)
	for _, s := range streams {
		for {
			done, err := s.Query()
			if done || err != nil {
				break
			}
			if time.Now().After(deadline) {
				return false
			}
			pause.For(100 * time.Microsecond)
		}
	}
	return true
}
