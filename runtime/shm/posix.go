//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// DefaultDir is where POSIX shared-memory segments live on Linux
// (shm_open(3) uses the same tmpfs).
const DefaultDir = "/dev/shm"

// Posix is the Provider for ranks that are processes on one host: segments
// are files on the tmpfs at Dir (DefaultDir when empty), mapped MAP_SHARED.
type Posix struct {
	Dir string // the tmpfs directory segments are created in; "" means DefaultDir
}

func (p Posix) dir() string {
	if p.Dir == "" {
		return DefaultDir
	}
	return p.Dir
}

// Path returns the file path of a segment name.
func (p Posix) Path(name string) string { return filepath.Join(p.dir(), name) }

type mmapSegment struct {
	name string
	mem  []byte
}

func (s *mmapSegment) Name() string  { return s.name }
func (s *mmapSegment) Bytes() []byte { return s.mem }

func (s *mmapSegment) Close() error {
	if s.mem == nil {
		return nil
	}
	err := syscall.Munmap(s.mem)
	s.mem = nil
	if err != nil {
		return fmt.Errorf("shm: unmap %s: %w", s.name, err)
	}
	return nil
}

// Kind returns "posix".
func (Posix) Kind() string { return "posix" }

// Create makes dir/name with O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600,
// reserves size bytes with fallocate (so a too-small tmpfs fails now with
// ENOSPC, wrapped in ErrNoSpace, instead of SIGBUS on first touch), maps
// it read-write and closes the descriptor (the mapping keeps the memory).
// On any failure it unlinks what it created.
func (p Posix) Create(name string, size int) (Segment, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := checkSize(name, size); err != nil {
		return nil, err
	}
	path := p.Path(name)
	fd, err := syscall.Open(path, syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return nil, fmt.Errorf("%w: %s: refusing to use a name someone else created (a squatter, or a leftover: remove it if no collgen job runs)", ErrExists, path)
		}
		return nil, fmt.Errorf("shm: create %s: %w", path, err)
	}
	defer syscall.Close(fd)
	fail := func(err error) (Segment, error) {
		syscall.Unlink(path)
		return nil, err
	}
	// The umask may have cleared bits but cannot have added any; make the
	// mode exactly 0600 regardless.
	if err := syscall.Fchmod(fd, 0o600); err != nil {
		return fail(fmt.Errorf("shm: chmod %s: %w", path, err))
	}
	if err := syscall.Fallocate(fd, 0, 0, int64(size)); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return fail(fmt.Errorf("%w in %s: %d bytes asked (%s): enlarge it (docker --shm-size, or mount -o remount,size=...) or lower the host backend's slot size", ErrNoSpace, p.dir(), size, err))
		}
		if !errors.Is(err, syscall.EOPNOTSUPP) {
			return fail(fmt.Errorf("shm: reserve %d bytes for %s: %w", size, path, err))
		}
		// A filesystem without fallocate: size it and accept lazy
		// allocation (tmpfs always supports fallocate).
		if err := syscall.Ftruncate(fd, int64(size)); err != nil {
			return fail(fmt.Errorf("shm: size %s: %w", path, err))
		}
	}
	mem, err := syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("shm: map %s: %w", path, err))
	}
	return &mmapSegment{name: name, mem: mem}, nil
}

// Open maps dir/name read-only after checking, on the open descriptor (so
// the file checked is the file mapped), that it is a regular file owned by
// the caller's effective uid, with no group or other permissions, of
// exactly size bytes.
func (p Posix) Open(name string, size int) (Segment, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := checkSize(name, size); err != nil {
		return nil, err
	}
	path := p.Path(name)
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, path)
		}
		return nil, fmt.Errorf("shm: open peer segment %s: %w", path, err)
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: stat %s: %w", path, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, fmt.Errorf("shm: peer segment %s is not a regular file; refusing it", path)
	}
	if uid := uint32(os.Geteuid()); st.Uid != uid {
		return nil, fmt.Errorf("shm: peer segment %s is owned by uid %d, not %d; refusing it (all ranks must run as one user)", path, st.Uid, uid)
	}
	if st.Mode&0o077 != 0 {
		return nil, fmt.Errorf("shm: peer segment %s has mode %#o, want 0600; refusing it", path, st.Mode&0o777)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("shm: peer segment %s has %d bytes, want %d; refusing it (another group's, or a different layout)", path, st.Size, size)
	}
	mem, err := syscall.Mmap(fd, 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: map %s: %w", path, err)
	}
	return &mmapSegment{name: name, mem: mem}, nil
}

// Unlink removes dir/name.
func (p Posix) Unlink(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if err := syscall.Unlink(p.Path(name)); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("%w: %s", ErrNotFound, p.Path(name))
		}
		return fmt.Errorf("shm: unlink %s: %w", p.Path(name), err)
	}
	return nil
}

// Leftovers lists the names in dir (DefaultDir when empty) that start with
// Prefix+infix, for tests and clean-up tools.
func Leftovers(dir, infix string) ([]string, error) {
	if dir == "" {
		dir = DefaultDir
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), Prefix+infix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// removeStale is RemoveStale for POSIX segments; see there.
func (p Posix) removeStale(name string, size int, valid func([]byte) bool) (bool, error) {
	if err := CheckName(name); err != nil {
		return false, err
	}
	path := p.Path(name)
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("shm: open %s: %w", path, err)
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("shm: stat %s: %w", path, err)
	}
	if !ownedBySelf(&st) {
		return false, nil
	}
	switch {
	case st.Size == 0:
		// A creator killed between open(O_CREAT) and fallocate: the file
		// holds nothing, and our uid with mode 0600 says it is ours.
	case st.Size == int64(size) && valid != nil:
		mem, err := syscall.Mmap(fd, 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
		if err != nil {
			return false, fmt.Errorf("shm: map %s: %w", path, err)
		}
		ok := valid(mem)
		syscall.Munmap(mem)
		if !ok {
			return false, nil
		}
	default:
		return false, nil
	}
	if err := syscall.Unlink(path); err != nil && !errors.Is(err, syscall.ENOENT) {
		return false, fmt.Errorf("shm: unlink %s: %w", path, err)
	}
	return true, nil
}

// ownedBySelf reports whether st is a regular file of the caller's
// effective uid with no group or other permissions: what Create makes.
func ownedBySelf(st *syscall.Stat_t) bool {
	return st.Mode&syscall.S_IFMT == syscall.S_IFREG && st.Uid == uint32(os.Geteuid()) && st.Mode&0o077 == 0
}

// SweepRun unlinks every segment in dir (DefaultDir when empty) whose name
// carries the run tag of runID (see RunNonce) and that the caller owns:
// a regular file of the caller's uid with mode 0600, whatever its size.
// Launchers call it after every rank of a run has exited, so segments of
// ranks killed during set-up, which no survivor was left to remove, are
// removed too. It returns the names it removed.
func SweepRun(dir, runID string) ([]string, error) {
	if err := CheckRunID(runID); err != nil {
		return nil, err
	}
	if dir == "" {
		dir = DefaultDir
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("shm: sweep run %s: %w", runID, err)
	}
	tag := "-" + runID + "."
	var removed []string
	var errs []error
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, Prefix) || !strings.Contains(n, tag) {
			continue
		}
		path := filepath.Join(dir, n)
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil || !ownedBySelf(&st) {
			continue
		}
		if err := syscall.Unlink(path); err != nil {
			if !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("shm: unlink %s: %w", path, err))
			}
			continue
		}
		removed = append(removed, n)
	}
	return removed, errors.Join(errs...)
}
