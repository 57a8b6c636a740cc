package comm

import (
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
