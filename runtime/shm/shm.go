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

// CheckName returns an error unless name is a valid collgen segment name:
// it starts with Prefix and holds only [A-Za-z0-9._-].
func CheckName(name string) error {
	if !strings.HasPrefix(name, Prefix) || len(name) > 200 {
		return fmt.Errorf("shm: bad segment name %q: must start with %q and be at most 200 bytes", name, Prefix)
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("shm: bad segment name %q: only letters, digits, '.', '_' and '-' are allowed", name)
		}
	}
	return nil
}
