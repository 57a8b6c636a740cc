//go:build linux && (amd64 || arm64)

package symm

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"github.com/collgen/collgen/internal/meminfo"
)

// memfd_create(2) and fcntl(2) sealing constants (the syscall package
// predates them).
const (
	mfdCloexec      = 0x1
	mfdAllowSealing = 0x2
	fAddSeals       = 1033
	fGetSeals       = 1034
	fSealSeal       = 0x1
	fSealShrink     = 0x2
	fSealGrow       = 0x4
)

// memfdName names every chunk; /proc/<pid>/maps shows it as
// "/memfd:collgen-symm (deleted)", which is how tests count mappings.
const memfdName = "collgen-symm"

// hostBackend is the host twin: CPU memory shared through memfd.
type hostBackend struct{ page int }

// NewHostBackend returns the host twin: every chunk is an anonymous memfd
// (memfd_create, close-on-exec, mode 0600, space reserved with fallocate,
// sealed against shrinking and growing), mapped MAP_SHARED at its place in
// an address reservation (mmap PROT_NONE). It never has a name in /dev/shm
// or anywhere else, so nothing can be left behind: the kernel frees the
// memory when the last descriptor and mapping of it, in any process, is
// gone. Ranks may be goroutines of one process or processes of one host;
// either way peers receive descriptors over fdpass. Signals run only in
// the Now ordering.
func NewHostBackend() Backend { return hostBackend{page: os.Getpagesize()} }

// reserveFlags map address space without memory: a reservation.
const reserveFlags = syscall.MAP_PRIVATE | syscall.MAP_ANONYMOUS | syscall.MAP_NORESERVE

// Kind, Granularity and HostAccessible: "host", the page size, true.
func (hostBackend) Kind() string         { return "host" }
func (b hostBackend) Granularity() int   { return b.page }
func (hostBackend) HostAccessible() bool { return true }

// checkSize accepts positive multiples of the page size; others are
// refused with ErrInvalidArgument.
func (b hostBackend) checkSize(n int) error {
	if n <= 0 || n%b.page != 0 {
		return invalidf("symm: host: size %d is not a positive multiple of the page size %d", n, b.page)
	}
	return nil
}

// mmap is mmap(2) with an address hint, which syscall.Mmap does not take.
func mmap(addr uintptr, size int, prot, flags uintptr, fd int) (uintptr, error) {
	r, _, e := syscall.Syscall6(syscall.SYS_MMAP, addr, uintptr(size), prot, flags, uintptr(fd), 0)
	if e != 0 {
		return 0, e
	}
	return r, nil
}

// munmap is munmap(2) on an address from mmap.
func munmap(addr uintptr, size int) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MUNMAP, addr, uintptr(size), 0); e != 0 {
		return e
	}
	return nil
}

// fcntl is fcntl(2) with an integer argument.
func fcntl(fd int, cmd, arg uintptr) (uintptr, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), cmd, arg)
	if e != 0 {
		return 0, e
	}
	return r, nil
}

// Reserve maps size bytes PROT_NONE, MAP_NORESERVE: address space only.
func (b hostBackend) Reserve(size int) (uintptr, error) {
	if err := b.checkSize(size); err != nil {
		return 0, err
	}
	addr, err := mmap(0, size, syscall.PROT_NONE, reserveFlags, -1)
	if errors.Is(err, syscall.ENOMEM) {
		return 0, &tagged{msg: fmt.Sprintf("symm: host: reserve %d bytes of address space: %v: more than this process has left to map; allocate less", size, err), is: []error{ErrNoMemory, err}}
	}
	if err != nil {
		return 0, fmt.Errorf("symm: host: reserve %d bytes of address space: %w", size, err)
	}
	return addr, nil
}

// Release unmaps a reservation.
func (b hostBackend) Release(addr uintptr, size int) error {
	if err := munmap(addr, size); err != nil {
		return fmt.Errorf("symm: host: release reservation at %#x: %w", addr, err)
	}
	return nil
}

// Create makes a sealed memfd of size bytes and maps it over the
// reservation at addr (MAP_FIXED replaces the PROT_NONE pages).
func (b hostBackend) Create(addr uintptr, size int) (Chunk, error) {
	if err := b.checkSize(size); err != nil {
		return nil, err
	}
	name := []byte(memfdName + "\x00")
	r, _, e := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(&name[0])), mfdCloexec|mfdAllowSealing, 0)
	if e != 0 {
		return nil, fmt.Errorf("symm: host: memfd_create: %w", e)
	}
	fd := int(r)
	fail := func(err error) (Chunk, error) {
		syscall.Close(fd)
		return nil, err
	}
	// memfd inodes start out 0777; peers refuse anything but 0600.
	if err := syscall.Fchmod(fd, 0o600); err != nil {
		return fail(fmt.Errorf("symm: host: chmod memfd: %w", err))
	}
	// A memfd is bounded by no file system: fallocate of more than the
	// process can take wakes the OOM killer instead of failing. Refuse
	// what is plainly beyond what is left (a snapshot; others may take
	// memory meanwhile, and then fallocate or the OOM killer decides).
	if avail, ok := meminfo.Available(); ok && int64(size) > avail {
		return fail(fmt.Errorf("%w: symm: host: %d bytes of shared memory asked, %d left to this process (MemAvailable and its memory cgroup)", ErrNoMemory, size, avail))
	}
	// Reserve the pages now, so a full memory cgroup or shmem limit fails
	// here instead of with SIGBUS on first touch.
	if err := syscall.Fallocate(fd, 0, 0, int64(size)); err != nil {
		return fail(fmt.Errorf("symm: host: reserve %d bytes of shared memory: %w", size, err))
	}
	// Sealed, the size can never change: a peer that maps it cannot be
	// made to fault by someone truncating the file.
	if _, err := fcntl(fd, fAddSeals, fSealShrink|fSealGrow|fSealSeal); err != nil {
		return fail(fmt.Errorf("symm: host: seal memfd: %w", err))
	}
	got, err := mmap(addr, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_FIXED, fd)
	if err != nil {
		// A failed MAP_FIXED may have removed part of the reservation;
		// put it back so the caller's Release stays valid.
		mmap(addr, size, syscall.PROT_NONE, reserveFlags|syscall.MAP_FIXED, -1)
		return fail(fmt.Errorf("symm: host: map %d bytes at %#x: %w", size, addr, err))
	}
	if got != addr {
		return fail(fmt.Errorf("symm: host: mmap MAP_FIXED at %#x returned %#x", addr, got))
	}
	return &hostChunk{fd: fd, addr: addr, size: size}, nil
}

// hostChunk is a rank's own memfd and its mapping. fd is held until Unmap
// so the chunk can be exported at any time.
type hostChunk struct {
	fd   int
	addr uintptr
	size int
}

// Export duplicates the memfd (close-on-exec).
func (c *hostChunk) Export() (*os.File, error) {
	if c.fd < 0 {
		return nil, fmt.Errorf("symm: host: export of an unmapped chunk at %#x", c.addr)
	}
	fd, err := fcntl(c.fd, syscall.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("symm: host: duplicate memfd: %w", err)
	}
	return os.NewFile(fd, memfdName), nil
}

// Unmap maps PROT_NONE pages over the chunk (the range stays reserved)
// and closes the memfd: this process no longer holds the memory.
func (c *hostChunk) Unmap() error {
	if c.fd < 0 {
		return nil
	}
	_, merr := mmap(c.addr, c.size, syscall.PROT_NONE, reserveFlags|syscall.MAP_FIXED, -1)
	cerr := syscall.Close(c.fd)
	c.fd = -1
	if merr != nil {
		return fmt.Errorf("symm: host: unmap chunk at %#x: %w", c.addr, merr)
	}
	if cerr != nil {
		return fmt.Errorf("symm: host: close memfd: %w", cerr)
	}
	return nil
}

// Import checks f (a regular file of this user, mode 0600, exactly size
// bytes, sealed against shrinking) and maps it read-write.
func (b hostBackend) Import(f *os.File, size int, at uintptr) (Mapping, error) {
	if err := b.checkSize(size); err != nil {
		return nil, err
	}
	if f == nil {
		return nil, invalidf("symm: host: Import of a nil file: pass a peer's Chunk.Export")
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var addr uintptr
	var ierr error
	if err := rc.Control(func(fd uintptr) { addr, ierr = b.importFD(int(fd), size, at) }); err != nil {
		return nil, err
	}
	if ierr != nil {
		return nil, ierr
	}
	return &hostMapping{addr: addr, size: size, reserved: at != 0}, nil
}

// importFD checks and maps fd, at at when it is not 0 (MAP_FIXED over the
// caller's PROT_NONE reservation). It runs inside f's
// SyscallConn.Control, which keeps fd open meanwhile.
func (b hostBackend) importFD(fd, size int, at uintptr) (uintptr, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("symm: host: stat peer memory: %w", err)
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		return 0, errors.New("symm: host: peer memory is not a regular file; refusing it")
	case st.Uid != uint32(os.Geteuid()):
		return 0, fmt.Errorf("symm: host: peer memory is owned by uid %d, not %d; refusing it", st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return 0, fmt.Errorf("symm: host: peer memory has mode %#o, want 0600; refusing it", st.Mode&0o777)
	case st.Size != int64(size):
		return 0, fmt.Errorf("symm: host: peer memory has %d bytes, want %d; refusing it", st.Size, size)
	}
	seals, err := fcntl(fd, fGetSeals, 0)
	if err != nil || seals&fSealShrink == 0 {
		return 0, fmt.Errorf("symm: host: peer memory is not sealed against shrinking (seals %#x, %v); refusing it", seals, err)
	}
	flags := uintptr(syscall.MAP_SHARED)
	if at != 0 {
		flags |= syscall.MAP_FIXED
	}
	addr, err := mmap(at, size, syscall.PROT_READ|syscall.PROT_WRITE, flags, fd)
	if err != nil {
		if at != 0 { // a failed MAP_FIXED may have taken part of the reservation
			mmap(at, size, syscall.PROT_NONE, reserveFlags|syscall.MAP_FIXED, -1)
		}
		return 0, fmt.Errorf("symm: host: map %d bytes of peer memory: %w", size, err)
	}
	return addr, nil
}

// hostMapping is a peer's memfd mapped into this process; reserved when
// it lies in the caller's reservation (Import's at).
type hostMapping struct {
	addr     uintptr
	size     int
	reserved bool
}

// Addr is where the peer's chunk is mapped.
func (m *hostMapping) Addr() uintptr { return m.addr }

// Unmap unmaps the peer's chunk; a second call does nothing.
func (m *hostMapping) Unmap() error {
	if m.addr == 0 {
		return nil
	}
	var err error
	if m.reserved { // PROT_NONE pages over it: the range stays the caller's
		_, err = mmap(m.addr, m.size, syscall.PROT_NONE, reserveFlags|syscall.MAP_FIXED, -1)
	} else {
		err = munmap(m.addr, m.size)
	}
	m.addr = 0
	if err != nil {
		return fmt.Errorf("symm: host: unmap peer memory: %w", err)
	}
	return nil
}

// Signal runs op on the calling goroutine; only Now is accepted.
func (hostBackend) Signal(o Ordering, op *SignalOp) error {
	if o != Now {
		return invalidf("symm: host: the host twin runs signals only in the Now ordering, not %v", o)
	}
	return hostSignal(op)
}
