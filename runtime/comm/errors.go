package comm

import (
	"context"
	"errors"
	"fmt"

	"github.com/collgen/collgen/runtime/host"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// Sentinel errors. Every error a Communicator returns wraps exactly one of
// them, so callers branch with errors.Is; the message keeps the details
// (which rank, which values, what to change).
var (
	// ErrInvalidArgument: the call or Config cannot describe a collective
	// (unknown dtype or op, negative or overflowing count, a buffer too
	// small, of the wrong kind or dtype, an algorithm that cannot run it).
	ErrInvalidArgument = errors.New("comm: invalid argument")
	// ErrMismatch: ranks disagree (world size, rank set, library, set-up,
	// or, in the debug check mode, a call's arguments).
	ErrMismatch = errors.New("comm: ranks disagree")
	// ErrTimeout: a rank waited for a peer past the deadline. A
	// *TimeoutError from a kernel matches it too.
	ErrTimeout = errors.New("comm: timeout")
	// ErrAborted: a peer failed, or an earlier failure left the
	// communicator unusable; make a new one. (A GPU communicator broken by
	// a kernel's timeout returns that *TimeoutError again instead.)
	ErrAborted = errors.New("comm: aborted")
	// ErrClosed: the communicator was closed.
	ErrClosed = errors.New("comm: closed")
	// ErrUnsupported: this build or machine cannot do what was asked (no
	// cgo, no GPU or driver, NCCL unavailable, no kernel for an explicitly
	// requested algorithm).
	ErrUnsupported = errors.New("comm: unsupported")
	// ErrBusy: another goroutine is issuing a collective on the same GPU
	// communicator; calls on one GPU communicator must not overlap.
	ErrBusy = errors.New("comm: busy")
	// ErrDevice: a CUDA driver, NVRTC or NCCL call failed, or the host
	// backend could not make its shared memory (a full /dev/shm).
	ErrDevice = errors.New("comm: device error")
)

// sentinels lists comm's sentinels, for classify.
var sentinels = []error{ErrInvalidArgument, ErrMismatch, ErrTimeout, ErrAborted, ErrClosed, ErrUnsupported, ErrBusy, ErrDevice}

// kindError is an error of one sentinel kind: its message is err's, and it
// unwraps to both err (the cause chain stays intact) and kind.
type kindError struct {
	kind error
	err  error
}

// Error is the cause's message: the kind adds no text.
func (e *kindError) Error() string { return e.err.Error() }

// Unwrap lets errors.Is and errors.As see both the cause chain and the kind.
func (e *kindError) Unwrap() []error { return []error{e.err, e.kind} }

// errorf formats an error of the given kind; %w in format wraps a cause.
func errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

// classify makes err match one of comm's sentinels: an error that already
// does is returned as is; errors of the host backend, the rendezvous store
// and contexts are mapped to their kind; anything else is a device error.
// classify(nil) is nil.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if hasKind(err) {
		return err
	}
	kind := ErrDevice
	switch {
	case errors.Is(err, host.ErrBroken):
		// Before the others: it wraps the failure that broke the group
		// (a mismatch, a timeout), but this call was refused for it.
		kind = ErrAborted
	case errors.Is(err, host.ErrInvalidArgument), errors.Is(err, rendezvous.ErrInvalidArgument):
		kind = ErrInvalidArgument
	case errors.Is(err, host.ErrMismatch), errors.Is(err, rendezvous.ErrWorldSizeMismatch), errors.Is(err, rendezvous.ErrDuplicateRank):
		kind = ErrMismatch
	case errors.Is(err, host.ErrClosed), errors.Is(err, rendezvous.ErrClosed):
		kind = ErrClosed
	case errors.Is(err, host.ErrPeerFailed), errors.Is(err, context.Canceled):
		kind = ErrAborted
	case errors.Is(err, host.ErrSharedMemory):
		kind = ErrDevice
	case errors.Is(err, host.ErrTimeout), errors.Is(err, rendezvous.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		kind = ErrTimeout
	}
	for _, k := range deviceKinds {
		if errors.Is(err, k.cause) {
			kind = k.kind
		}
	}
	return &kindError{kind: kind, err: err}
}

// deviceKinds maps errors of cgo-only packages (runtime/nccl) to their
// kind; filled by the cgo build (device_abort.go).
var deviceKinds []struct{ cause, kind error }

// KernelError is a generated kernel that could not be compiled or loaded
// (a *cuda.CompileError with NVRTC's log, a fatbin without it, a driver
// error). errors.Is(err, ErrDevice) is true for it, unless its cause is
// already of another kind (a library without the kernel's source:
// ErrInvalidArgument).
type KernelError struct {
	Kernel string // the kernel's name, e.g. allreduce_oneshot_bf16_sum_w4
	Err    error  // the cause
}

// Error names the kernel and the cause.
func (e *KernelError) Error() string { return "comm: kernel " + e.Kernel + ": " + e.Err.Error() }

// Unwrap returns the cause, and ErrDevice when the cause matches no
// sentinel: the error always matches exactly one.
func (e *KernelError) Unwrap() []error {
	if hasKind(e.Err) {
		return []error{e.Err}
	}
	return []error{e.Err, ErrDevice}
}

// hasKind reports whether err matches one of the sentinels.
func hasKind(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// TimeoutError is a kernel's report that a rank waited too long for a peer.
// errors.Is(err, ErrTimeout) is true for it.
type TimeoutError struct {
	Kernel  string // the kernel that timed out
	Rank    int    // the rank that waited
	Peer    int    // the rank it waited for
	Barrier int    // which barrier of the kernel; for Data, the phase
	Block   int    // the thread block that waited
	// Data: an LL kernel waited for the peer's data (there are no barriers).
	Data bool
	// Hint, when set, names a likely cause this process can see: the peer
	// shares this rank's CUDA context (case 39).
	Hint string
	// Calls, when set, is what the peer said of its calls, asked through
	// the store once the deadline passed: the first call it issued
	// differently (a staged input where this rank's was symmetric, another
	// count, a call it refused), a call it has not issued, that it issued
	// the same, or that it gave no account (dead or stalled).
	Calls string
}

// Error names the kernel, both ranks and where the wait was.
func (e *TimeoutError) Error() string {
	at := fmt.Sprintf("at barrier %d", e.Barrier)
	if e.Data {
		at = fmt.Sprintf("for its data in phase %d", e.Barrier)
	}
	msg := fmt.Sprintf("comm: %s timed out: rank %d waited for rank %d %s (block %d); the peer is dead, stalled or issuing a different collective",
		e.Kernel, e.Rank, e.Peer, at, e.Block)
	if e.Hint != "" {
		msg += "; " + e.Hint
	}
	if e.Calls != "" {
		msg += "; " + e.Calls
	}
	return msg
}

// Is makes errors.Is(err, ErrTimeout) true for a *TimeoutError.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }
