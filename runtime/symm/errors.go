//go:build linux && (amd64 || arm64)

package symm

import (
	"errors"
	"fmt"
	"time"
)

// ErrTimeout is wrapped by every error that reports a passed deadline: a
// signal wait (*TimeoutError), a rendezvous whose peers did not all arrive.
var ErrTimeout = errors.New("symm: timeout")

// ErrClosed is returned by operations on a closed Pool.
var ErrClosed = errors.New("symm: pool closed")

// ErrFreed is wrapped by operations on a freed Buffer or its Handle.
var ErrFreed = errors.New("symm: buffer freed")

// ErrNoMemory is wrapped by Alloc and AllocPersistent when the memory is
// not there: on the host twin, more than the process has left (its
// memory cgroup and MemAvailable), checked before any is taken, or more
// address space than it can still map; on GPUs, the driver's
// out-of-memory.
var ErrNoMemory = errors.New("symm: out of memory")

// ErrBroken is wrapped by Rendezvous on a pool where an earlier Rendezvous
// failed other than by a disagreement (a missing rank, a cancelled ctx, a
// store error): ranks may have parted at different steps, so the pool can
// take no more collective steps. Close it and form a new one.
var ErrBroken = errors.New("symm: pool broken")

// ErrNotFromPool is wrapped by Rendezvous when the buffer was not
// allocated by the pool it is given to.
var ErrNotFromPool = errors.New("symm: buffer not from this pool")

// ErrInvalidArgument is wrapped by refusals of a caller's argument or
// configuration: a size, world size, rank, channel, peer or timeout out of
// range, a persistent id in use or asked for with another size. Nothing
// was done; the message names the value and what is allowed.
var ErrInvalidArgument = errors.New("symm: invalid argument")

// ErrMismatch is wrapped when ranks disagree on something they must agree
// on (world size, allocation size, channels, backend); the message names
// both values and both ranks.
var ErrMismatch = errors.New("symm: ranks disagree")

// TimeoutError reports a signal operation that passed its deadline: the
// peer is dead, stuck, or not taking part. It wraps ErrTimeout. After a
// timeout the channel's words are in an unknown state (a put may have
// landed while its wait did not); treat the group as broken.
type TimeoutError struct {
	// Op is the operation: put, wait or barrier.
	Op SignalKind
	// Rank is the rank that timed out; Peer the rank it waited for.
	Rank, Peer int
	// Channel is the signal channel.
	Channel int
	// Waited is how long the operation ran before giving up.
	Waited time.Duration
	// Consume is true when the wait was for Peer to consume this rank's
	// previous signal (a put into a full word), false when it was for
	// Peer's signal to arrive.
	Consume bool
	// Hint, when set, names a likely cause this process can see (ranks
	// sharing a GPU with few hardware work queues).
	Hint string
}

// Error reads "symm: rank 0 barrier on channel 3: no signal from rank 2
// after 2s" or "... rank 2 has not consumed the previous signal after 2s".
func (e *TimeoutError) Error() string {
	what := fmt.Sprintf("no signal from rank %d", e.Peer)
	if e.Consume {
		what = fmt.Sprintf("rank %d has not consumed the previous signal", e.Peer)
	}
	msg := fmt.Sprintf("symm: rank %d %s on channel %d: %s after %v (dead, stuck or not taking part)",
		e.Rank, e.Op, e.Channel, what, e.Waited.Round(time.Millisecond))
	if e.Hint != "" {
		msg += "; " + e.Hint
	}
	return msg
}

// Unwrap makes errors.Is(err, ErrTimeout) true.
func (e *TimeoutError) Unwrap() error { return ErrTimeout }

// tagged is an error that reads as its message alone and matches every
// error in is with errors.Is and errors.As. Sentinels are matched without
// their text ("symm: ranks disagree") repeated inside a message that a
// caller has already prefixed with where it happened.
type tagged struct {
	msg string
	is  []error
}

func (e *tagged) Error() string   { return e.msg }
func (e *tagged) Unwrap() []error { return e.is }

// mismatchf formats a disagreement between ranks; it matches ErrMismatch.
func mismatchf(format string, args ...any) error {
	return &tagged{msg: fmt.Sprintf(format, args...), is: []error{ErrMismatch}}
}

// invalidf formats a refused argument; it matches ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	return &tagged{msg: fmt.Sprintf(format, args...), is: []error{ErrInvalidArgument}}
}
