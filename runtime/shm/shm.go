// Package shm provides the memory the host backend's ranks share: POSIX
// shared-memory segments under /dev/shm for ranks that are processes on one
// host, and an in-process variant over ordinary memory for ranks that are
// goroutines of one process. Both have the same interface, so the host
// backend's executor does not know which one it runs on.
//
// Lifecycle (see docs/host-backend.md): each rank Creates its own segment
// (O_CREAT|O_EXCL, mode 0600, space reserved with fallocate), every rank
// Opens its peers' segments read-only after checking owner and size, and
// once every rank has mapped every segment the names are Unlinked, so the
// mappings live on with no name left behind. Close unmaps.
package shm

import (
	"errors"
	"fmt"
	"strings"
)

// Prefix starts every segment name collgen creates, so tests and operators
// can find leftovers with `ls /dev/shm/collgen-*`.
const Prefix = "collgen-"

// ErrExists is wrapped by Create when the name is already taken: a leftover
// of a crashed run that was not cleaned up, or a segment squatted by
// another user to intercept collgen's data. Either way collgen refuses it.
var ErrExists = errors.New("shm: segment already exists")

// ErrNotFound is wrapped by Open and Unlink when no segment has the name.
var ErrNotFound = errors.New("shm: no such segment")

// ErrNoSpace is wrapped by Create when the segment's memory is not there:
// a POSIX segment's tmpfs has no room for it, or an in-process segment is
// larger than the memory the process has left. Nothing was created.
var ErrNoSpace = errors.New("shm: no room for the segment")

// ErrInvalidArgument is wrapped by refusals of a caller's argument: a
// segment name that is not a collgen name, a size that is not positive, a
// malformed run id, a nil Provider. Nothing was done; the message names the
// value and what is allowed.
var ErrInvalidArgument = errors.New("shm: invalid argument")

// invalidf formats an error wrapping ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// checkSize refuses a segment size that is not positive.
func checkSize(name string, size int) error {
	if size <= 0 {
		return invalidf("segment %s: size %d must be positive", name, size)
	}
	return nil
}

// Segment is one mapped shared region.
type Segment interface {
	// Name is the segment's name (no directory).
	Name() string
	// Bytes is the mapped memory; its start is page aligned (8-byte aligned
	// for in-process segments), so 64-bit atomics work on any multiple of
	// 8 bytes into it. Peers' segments returned by Open are read-only.
	Bytes() []byte
	// Close unmaps the segment. Bytes must not be used afterwards.
	Close() error
}

// Provider creates, opens and unlinks segments.
type Provider interface {
	// Kind names the provider: "posix" or "inprocess".
	Kind() string
	// Create makes a new segment of size bytes, owned by the caller and
	// zeroed, failing (wrapping ErrExists) if the name is taken. Its
	// memory is reserved up front, so a full /dev/shm fails here rather
	// than with SIGBUS on first touch.
	Create(name string, size int) (Segment, error)
	// Open maps an existing segment read-only after checking that it is
	// owned by the caller's user, is not accessible to others and has
	// exactly size bytes.
	Open(name string, size int) (Segment, error)
	// Unlink removes the name; mappings stay valid until closed. It wraps
	// ErrNotFound when the name does not exist.
	Unlink(name string) error
}

// RemoveStale removes a segment name left by a rank that died during
// set-up, if the caller owns it: for POSIX segments a regular file of the
// caller's uid with mode 0600 that is either empty (its creator was killed
// between creating the file and reserving its memory) or of exactly size
// bytes with contents valid accepts (nil accepts nothing of that size).
// Anything else (another user's file, other permissions, another size) is
// left alone, so a squatter's file is never removed. It reports whether
// it removed the name; a name that does not exist is not an error. A nil
// p, a bad name or a negative size is refused (ErrInvalidArgument).
func RemoveStale(p Provider, name string, size int, valid func([]byte) bool) (bool, error) {
	if p == nil {
		return false, invalidf("RemoveStale of %s: nil Provider", name)
	}
	if err := CheckName(name); err != nil {
		return false, err
	}
	if size < 0 {
		return false, invalidf("RemoveStale of %s: size %d must not be negative", name, size)
	}
	if sr, ok := p.(staleRemover); ok {
		return sr.removeStale(name, size, valid)
	}
	s, err := p.Open(name, size)
	if err != nil {
		return false, nil
	}
	ok := valid != nil && valid(s.Bytes())
	s.Close()
	if !ok {
		return false, nil
	}
	if err := p.Unlink(name); err != nil && !errors.Is(err, ErrNotFound) {
		return false, err
	}
	return true, nil
}

// staleRemover is implemented by providers whose segments can be left
// half-made by a killed creator (Posix: an empty file).
type staleRemover interface {
	removeStale(name string, size int, valid func([]byte) bool) (bool, error)
}

// RunNonce returns the segment-name nonce for a run: runID, a dot, then
// random (both checked by the caller), so SweepRun(runID) finds every
// segment of the run. Without a run id the nonce is random alone.
func RunNonce(runID, random string) string {
	if runID == "" {
		return random
	}
	return runID + "." + random
}

// CheckRunID returns an error wrapping ErrInvalidArgument unless id is a
// valid run id: 8 to 16 letters and digits (collgen run makes 16 hex
// digits).
func CheckRunID(id string) error {
	if len(id) < 8 || len(id) > 16 {
		return invalidf("run id %q: want 8 to 16 letters and digits", id)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return invalidf("run id %q: want 8 to 16 letters and digits", id)
		}
	}
	return nil
}

// CheckName returns an error wrapping ErrInvalidArgument unless name is a
// valid collgen segment name: it starts with Prefix and holds only
// [A-Za-z0-9._-].
func CheckName(name string) error {
	if !strings.HasPrefix(name, Prefix) || len(name) > 200 {
		return invalidf("bad segment name %q: must start with %q and be at most 200 bytes", name, Prefix)
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return invalidf("bad segment name %q: only letters, digits, '.', '_' and '-' are allowed", name)
		}
	}
	return nil
}
