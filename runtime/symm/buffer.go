//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Buffer is one local allocation of a Pool: Size bytes at Addr, followed
// in the same chunk by this rank's signal pad for the allocation.
//
// Free semantics: Free is local and returns at once. It unmaps this rank's
// chunk and every peer mapping made by Rendezvous; peers keep their own
// mappings of this rank's memory, which stays allocated (kernel or driver
// reference counts) until the last of them frees its Handle, and is then
// released without anyone's help, even when ranks were killed. Writes a
// peer makes after this rank's Free land in memory nobody reads. So
// nothing is freed under a peer and nothing leaks, but a rank must not
// Free while it expects peers to read its data: put a Barrier first.
type Buffer struct {
	pool       *Pool
	addr       uintptr
	size       int
	chunkSize  int
	padOff     int
	id         uint64
	persistent bool

	// mu is held for writing by Free and by Rendezvous to start and to
	// finish (never while it waits for peers), and for reading by signal
	// operations, so Free never unmaps memory a signal operation of this
	// process is touching.
	mu    sync.RWMutex
	chunk Chunk
	// stopping is set (stopByFree, stopByClose) by free before it takes
	// mu, so a signal operation holding mu's read lock while it waits for
	// a peer ends at once instead of holding Free back until its timeout.
	stopping atomic.Int32
	freed    bool
	byClose  bool // freed by the pool's Close
	// rdv (one slot) serialises Rendezvous calls on the buffer, a wait for
	// it ending with the caller's ctx; cancelRdv (under mu) ends the one
	// waiting for peers, for Free and Close.
	rdv       chan struct{}
	cancelRdv context.CancelCauseFunc
	// handle is set once, under mu, by the first Rendezvous, and read
	// without a lock (Handle runs on every collective's zero-copy check).
	// It stays set after Free; the Handle then reports ErrFreed.
	handle atomic.Pointer[Handle]
}

// Pool is the pool the buffer came from.
func (b *Buffer) Pool() *Pool { return b.pool }

// Addr is where the buffer starts in this process (a device address on
// the GPU backend). A persistent buffer's Addr is the same for every
// allocation under its id.
func (b *Buffer) Addr() uintptr { return b.addr }

// Size is the number of bytes asked for.
func (b *Buffer) Size() int { return b.size }

// ID returns the persistent id and true for a buffer from
// AllocPersistent, and 0, false otherwise.
func (b *Buffer) ID() (uint64, bool) { return b.id, b.persistent }

// Bytes is the buffer's memory, when the backend's memory is host
// accessible (the host twin), and nil otherwise or once freed. The slice
// must not be used after Free: the pages behind it are gone.
func (b *Buffer) Bytes() []byte {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.freed || !b.pool.be.HostAccessible() {
		return nil
	}
	return unsafe.Slice((*byte)(ptrAt(b.addr)), b.size)
}

// Handle returns the buffer's Handle if Rendezvous has run on it, else
// nil. It takes no lock.
func (b *Buffer) Handle() *Handle { return b.handle.Load() }

// Free releases this rank's hold on the buffer (see the type's comment)
// and removes it from Lookup. The buffer and its Handle report ErrFreed
// afterwards (and ErrClosed too once the pool's Close freed it), and a
// persistent id becomes free for AllocPersistent. A Rendezvous of the
// buffer still waiting for peers ends at once with ErrFreed, and so does a
// host twin signal operation of its Handle waiting for a peer (on the GPU,
// a Now signal's kernel runs to its end or deadline first). The Handle's
// addresses (BufferPtrs, SignalPadPtrs, Peer, the device arrays) are no
// longer mapped in this process after Free.
func (b *Buffer) Free() error { return b.free(false) }

// free is Free, and Close's free of a live buffer (byClose).
func (b *Buffer) free(byClose bool) error {
	stop := int32(stopByFree)
	if byClose {
		stop = stopByClose
	}
	b.stopping.CompareAndSwap(0, stop)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		if b.byClose {
			return b.freedErr("free")
		}
		return fmt.Errorf("%w: the buffer at %#x was already freed", ErrFreed, b.addr)
	}
	b.freed, b.byClose = true, byClose
	if b.cancelRdv != nil {
		cause := ErrFreed
		if byClose {
			cause = ErrClosed
		}
		b.cancelRdv(cause)
	}
	unregister(b)
	var errs []error
	if h := b.handle.Load(); h != nil {
		errs = append(errs, h.unmap())
	}
	errs = append(errs, b.chunk.Unmap())
	p := b.pool
	p.mu.Lock()
	delete(p.live, b)
	if b.persistent {
		// The slot is still there: Close releases slots only after the
		// Free of every live buffer has returned.
		p.persist[b.id].buf = nil
	} else {
		errs = append(errs, p.be.Release(b.addr, b.chunkSize))
	}
	p.mu.Unlock()
	return errors.Join(errs...)
}

// Values of Buffer.stopping: what is freeing the buffer.
const (
	stopByFree  = 1
	stopByClose = 2
)

// freedErr is the error of an operation (what) on a freed buffer, nil if
// it is not freed; b.mu is held. It wraps ErrFreed, and ErrClosed when the
// pool's Close freed it.
func (b *Buffer) freedErr(what string) error {
	switch {
	case !b.freed:
		return nil
	case b.byClose:
		return &tagged{msg: fmt.Sprintf("symm: %s of the buffer at %#x: its pool is closed", what, b.addr), is: []error{ErrClosed, ErrFreed}}
	}
	return fmt.Errorf("%w: %s of the buffer at %#x", ErrFreed, what, b.addr)
}
