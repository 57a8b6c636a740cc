package shm

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/collgen/collgen/internal/meminfo"
)

// InProcess is the Provider for ranks that are goroutines of one process:
// segments are ordinary Go memory in a process-wide registry keyed by name,
// with the same create-exclusive, open-checked, unlink-after-mapping
// semantics as POSIX segments. The memory is freed by the garbage
// collector once the name is unlinked and every holder has dropped it.
type InProcess struct{}

var inproc struct {
	mu   sync.Mutex
	segs map[string][]byte
}

type memSegment struct {
	name string
	mem  []byte
}

func (s *memSegment) Name() string  { return s.name }
func (s *memSegment) Bytes() []byte { return s.mem }
func (s *memSegment) Close() error  { s.mem = nil; return nil }

// Kind returns "inprocess".
func (InProcess) Kind() string { return "inprocess" }

// Create registers a zeroed, 8-byte aligned region under name. A size
// beyond the memory the process has left is refused (ErrNoSpace).
func (InProcess) Create(name string, size int) (Segment, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := checkSize(name, size); err != nil {
		return nil, err
	}
	// Go memory beyond what is left is a fatal out-of-memory (or, for
	// the largest sizes, a panic in make), not an error: refuse it first.
	if avail, ok := meminfo.Available(); ok && int64(size) > avail {
		return nil, fmt.Errorf("%w: in-process segment %s of %d bytes: %d left to this process (MemAvailable and its memory cgroup); lower the host backend's slot size", ErrNoSpace, name, size, avail)
	}
	inproc.mu.Lock()
	defer inproc.mu.Unlock()
	if _, ok := inproc.segs[name]; ok {
		return nil, fmt.Errorf("%w: %s (in-process)", ErrExists, name)
	}
	if inproc.segs == nil {
		inproc.segs = map[string][]byte{}
	}
	// Allocate as uint64s so the start is 8-byte aligned for atomics.
	words := make([]uint64, size/8+(size%8+7)/8) // (size+7)/8 could overflow
	mem := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), size)
	inproc.segs[name] = mem
	return &memSegment{name: name, mem: mem}, nil
}

// Open returns the region registered under name after checking its size.
func (InProcess) Open(name string, size int) (Segment, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := checkSize(name, size); err != nil {
		return nil, err
	}
	inproc.mu.Lock()
	defer inproc.mu.Unlock()
	mem, ok := inproc.segs[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s (in-process)", ErrNotFound, name)
	}
	if len(mem) != size {
		return nil, fmt.Errorf("shm: segment %s has %d bytes, want %d: it belongs to another group or layout", name, len(mem), size)
	}
	return &memSegment{name: name, mem: mem}, nil
}

// Unlink removes name from the registry.
func (InProcess) Unlink(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	inproc.mu.Lock()
	defer inproc.mu.Unlock()
	if _, ok := inproc.segs[name]; !ok {
		return fmt.Errorf("%w: %s (in-process)", ErrNotFound, name)
	}
	delete(inproc.segs, name)
	return nil
}

// InProcessNames returns the names currently registered in-process (for
// leak tests).
func InProcessNames() []string {
	inproc.mu.Lock()
	defer inproc.mu.Unlock()
	var names []string
	for n := range inproc.segs {
		names = append(names, n)
	}
	return names
}
