//go:build linux && (amd64 || arm64)

package symm

import (
	"os"
	"sync/atomic"
	"time"
)

// Backend is the memory a Pool is made of. The pool decides sizes,
// addresses, ids and who talks to whom; the backend only makes, shares and
// maps memory and runs signal operations on it. There are two: the host
// twin (NewHostBackend: memfd shared memory, CPU ranks) and the CUDA
// backend (NewCUDABackend: VMM memory on one GPU per rank, built with
// cgo), whose comment maps each method to the driver calls it makes.
// Backends may also implement LocalSharer (ranks of one process map each
// other without descriptors) and DeviceArrayMaker (pointer arrays in
// device memory).
//
// Ownership: memory lives while any rank maps it. Each rank owns exactly
// its own Chunk and Mappings and releases them; the kernel (for memfd) or
// the driver (for VMM handles) frees the memory once the last holder in any
// process has let go, so a rank never frees memory a peer still maps, and a
// killed process's holds are dropped by the kernel.
//
// Methods are called by one goroutine at a time per Chunk or Mapping, but
// Reserve, Create and Import may run concurrently for different chunks.
type Backend interface {
	// Kind names the backend in errors and agreement checks ("host").
	// Every rank of a pool must use the same kind.
	Kind() string
	// Granularity is the size that every reservation and chunk is a
	// multiple of (the page size on the host); positive, or NewPool
	// refuses the backend.
	Granularity() int
	// HostAccessible reports whether the CPU can load and store through
	// the addresses this backend returns (true on the host twin).
	HostAccessible() bool
	// Reserve reserves size bytes of address space with no memory behind
	// it, so no other mapping can take the range.
	Reserve(size int) (addr uintptr, err error)
	// Release returns a reservation; nothing may be mapped in it.
	Release(addr uintptr, size int) error
	// Create makes size bytes of new, zeroed memory that other processes
	// can map, and maps it read-write at addr, the start of a reservation
	// of at least size bytes.
	Create(addr uintptr, size int) (Chunk, error)
	// Import maps a peer's chunk, exported as f, read-write: at a fresh
	// address when at is 0, else at at, the start of a reservation of at
	// least size bytes that the caller owns (a persistent allocation keeps
	// one per peer, so peers' addresses stay too); the mapping's Unmap
	// then leaves the range reserved. It checks that f is memory of the
	// expected size that this user owns, and refuses anything else. The
	// caller still owns f and closes it afterwards; the mapping does not
	// need it.
	Import(f *os.File, size int, at uintptr) (Mapping, error)
	// Signal runs op in the ordering o. An ordering the backend cannot
	// honour is an error wrapping ErrInvalidArgument; a wait past
	// op.Timeout is a *TimeoutError
	// (possibly reported later through the ordering, on the GPU).
	Signal(o Ordering, op *SignalOp) error
}

// Chunk is a rank's own memory, created by Backend.Create.
type Chunk interface {
	// Export returns a new descriptor for the memory that a peer process
	// can pass to Backend.Import. The caller closes it.
	Export() (*os.File, error)
	// Unmap removes the memory from this process and drops this rank's
	// hold on it; the address range goes back to being reserved, so a
	// persistent allocation can map new memory at the same address. The
	// memory itself lives on while any peer still maps it.
	Unmap() error
}

// Mapping is a peer's chunk mapped into this process by Backend.Import.
type Mapping interface {
	// Addr is where the peer's chunk starts in this process.
	Addr() uintptr
	// Unmap removes the mapping and drops this rank's hold on the peer's
	// memory; the address range goes too, unless it was the caller's
	// reservation (Import's at), which stays reserved.
	Unmap() error
}

// Ordering says where a signal operation runs. Now runs it on the calling
// goroutine, which returns when it completed or its deadline passed: that
// is all the host twin has. The GPU backend adds orderings that name a
// stream: operations then run in stream order and the call returns once
// they are enqueued.
type Ordering interface {
	// String names the ordering in errors.
	String() string
}

// Now is the Ordering that runs a signal operation synchronously on the
// calling goroutine.
var Now Ordering = now{}

// now is Now's type.
type now struct{}

// String names the ordering.
func (now) String() string { return "now (the calling goroutine)" }

// SignalKind is what a SignalOp does.
type SignalKind uint8

// The signal operations. Each signal word belongs to one (channel, sender)
// pair of one receiver's pad and holds 0 (empty) or 1 (signalled). A put
// sets the word in the receiver's pad from 0 to 1 with release ordering,
// waiting while it is still 1 (the previous signal not yet consumed); a
// wait changes the word in the caller's own pad from 1 to 0 with acquire
// ordering, waiting while it is 0. So every store the sender made before
// its put is visible to the receiver after its wait, and the words need no
// reset between rounds.
const (
	// SignalPut signals every peer in Peers through Put[i].
	SignalPut SignalKind = iota + 1
	// SignalWait consumes a signal from every peer in Peers at Wait[i].
	SignalWait
	// SignalBarrier puts to every peer, then waits for every peer.
	SignalBarrier
)

// String returns put, wait or barrier.
func (k SignalKind) String() string {
	switch k {
	case SignalPut:
		return "put"
	case SignalWait:
		return "wait"
	case SignalBarrier:
		return "barrier"
	}
	return "signal?"
}

// SignalOp is one signal operation, with every address resolved by the
// Handle so that a backend only touches words.
type SignalOp struct {
	Kind SignalKind // put, wait or barrier: which of Put and Wait are set
	// Rank is the calling rank and Channel the channel, for errors.
	Rank, Channel int
	// Peers are the ranks signalled or waited for, in order.
	Peers []int
	// Put[i] is the address of this rank's word in Peers[i]'s pad, as
	// mapped in this process (SignalPut and SignalBarrier).
	Put []uintptr
	// Wait[i] is the address of Peers[i]'s word in this rank's own pad
	// (SignalWait and SignalBarrier).
	Wait []uintptr
	// Timeout bounds the whole operation.
	Timeout time.Duration

	// stop, set by the Handle, becomes non-zero when the buffer's Free or
	// its pool's Close starts: the host twin's waits then end at once
	// (errSignalStopped) instead of holding Free back until Timeout.
	stop *atomic.Int32
}

// LocalSharer is an optional Backend interface for memory that another
// pool of this same process can map without a descriptor: goroutine ranks
// of one process, one GPU each, map the owner's CUDA allocation directly
// (a descriptor exported and imported again by the same process is not
// something every driver supports). The pool uses it for peers in this
// process and the descriptor path (Export, Import) for the others.
type LocalSharer interface {
	// ShareLocal returns a token for c that ImportLocal of any backend of
	// the same kind in this process accepts while c is mapped (until its
	// Unmap).
	ShareLocal(c Chunk) (token uint64, err error)
	// ImportLocal maps the chunk behind token read-write, at a fresh
	// address or at at, like Import. The mapping keeps the memory alive
	// after the owner's Unmap, as an imported one does.
	ImportLocal(token uint64, size int, at uintptr) (Mapping, error)
}

// DeviceArrayMaker is an optional Backend interface for backends whose
// kernels need the pointer arrays in device memory (Handle.BufferPtrsDev,
// SignalPadPtrsDev): the CUDA backend copies them there once per Handle.
type DeviceArrayMaker interface {
	// DeviceArray copies ptrs (8 bytes each) into new device memory and
	// returns its address and the function that frees it.
	DeviceArray(ptrs []uintptr) (addr uintptr, free func() error, err error)
}
