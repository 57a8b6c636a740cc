//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"
)

// Handle is the result of a Rendezvous: every rank's buffer and signal
// pad, mapped into this process. It belongs to its Buffer and lives until
// the buffer is freed.
//
// Signal pads: each rank's pad holds Channels × WorldSize words of 4
// bytes; word (ch, s) of rank r's pad, at pad_r + 4·(ch·WorldSize + s), is
// written only by rank s (put: 0 → 1) and cleared only by rank r (wait:
// 1 → 0). Pads start zeroed, and every allocation has a new one: the pool
// never reuses memory a peer may still map, so a pad can never hold a
// stale signal (a persistent id reuses the address, not the memory). See
// SignalKind for the memory ordering.
type Handle struct {
	buf      *Buffer
	rank     int
	world    int
	channels int
	timeout  time.Duration
	ptrs     []uintptr // every rank's buffer, as mapped here
	pads     []uintptr // every rank's signal pad, as mapped here
	maps     []Mapping // peers' chunks; nil at this rank

	// ptrsDev and padsDev are ptrs and pads copied to device memory, for
	// backends that are DeviceArrayMakers (0 otherwise); freeDev frees
	// them, with the mappings, at Free.
	ptrsDev, padsDev uintptr
	freeDev          []func() error
}

// rdvInfo is what each rank publishes at a Rendezvous.
type rdvInfo struct {
	Bytes int    // the buffer's size
	Chunk int    // its chunk's size
	Seq   uint64 // the descriptor's sequence number at the rank's server
	// Proc identifies the rank's process (procID) and Local its chunk's
	// LocalSharer token, so that a peer of the same process can map the
	// chunk without the descriptor.
	Proc  string `json:",omitempty"`
	Local uint64 `json:",omitempty"`
}

// rdvStatus is each rank's outcome of mapping its peers.
type rdvStatus struct{ Err string }

// Rendezvous maps every rank's corresponding buffer into this process and
// returns the Handle. It is collective: every rank calls it on its own
// buffer, in the same order as its other Rendezvous calls. It is cached:
// later calls on the same buffer return the same Handle without talking
// to anyone.
//
// Every rank checks every rank's buffer size; a mismatch fails on every
// rank with an error naming both sizes (wrapping ErrMismatch), and the pool
// stays usable. If any rank cannot map a peer's memory, every rank fails
// with that rank's reason and unmaps what it mapped; the pool stays usable
// then too (every rank saw the same reports). A buffer from another
// pool, or freed, is an error (ErrNotFromPool, ErrFreed) without any
// collective step, and so is a closed pool (ErrClosed) or a broken one.
//
// A Rendezvous that fails otherwise (a rank that does not come in time, a
// cancelled ctx, a store error, the buffer's Free or the pool's Close while
// it waits, which end it at once with ErrFreed or ErrClosed) breaks the
// pool: ranks may have parted at different steps, so every later
// Rendezvous fails at once with ErrBroken naming the first failure.
// Handles made before keep working; close the pool and form a new one.
func (p *Pool) Rendezvous(ctx context.Context, b *Buffer) (*Handle, error) {
	if b == nil || b.pool != p {
		return nil, fmt.Errorf("%w: group %q rank %d: pass a buffer this pool allocated (Lookup finds the buffer of a pointer)", ErrNotFromPool, p.cfg.Group, p.cfg.Rank)
	}
	// A shared lock, as signal operations hold: a repeat Rendezvous does
	// not wait for them. The handle stays set after Free (see Buffer), so
	// freed is tested first.
	b.mu.RLock()
	ferr, h := b.freedErr("rendezvous"), b.handle.Load()
	b.mu.RUnlock()
	if ferr != nil {
		return nil, ferr
	}
	if h != nil {
		return h, nil
	}
	// One Rendezvous of the buffer at a time; b.mu is held only to start
	// and to finish, so Free, Close, Bytes and signals never wait for
	// peers (Free and Close end the collective through cancel).
	// A wait for another Rendezvous of the buffer (the buffer's collective
	// step, whose handle this call would return) ends with this call's
	// ctx, and breaks nothing.
	if err := acquire(ctx, b.rdv, "another Rendezvous of the buffer ran"); err != nil {
		return nil, fmt.Errorf("symm: group %q rank %d, rendezvous of the buffer at %#x: %w", p.cfg.Group, p.cfg.Rank, b.addr, err)
	}
	defer func() { <-b.rdv }()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	b.mu.Lock()
	if err := b.freedErr("rendezvous"); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if h := b.handle.Load(); h != nil {
		b.mu.Unlock()
		return h, nil // another goroutine's call finished first
	}
	if err := p.usable(); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	mine, f, err := p.share(b)
	if err != nil {
		b.mu.Unlock()
		// The peers go on to this Rendezvous without this rank: its next
		// call would meet their n-th, so the pool breaks as documented.
		err = fmt.Errorf("symm: group %q rank %d: share the buffer at %#x: %w", p.cfg.Group, p.cfg.Rank, b.addr, err)
		p.breakWith(err)
		return nil, err
	}
	b.cancelRdv = cancel
	p.rdvs.Add(1)
	defer p.rdvs.Done()
	b.mu.Unlock()

	// Queued behind this pool's earlier Rendezvous calls: Free, Close and
	// ctx end the wait at once. A call given up here took no collective
	// step, but this rank's calls no longer meet its peers' in order, so
	// it breaks the pool like any other.
	what := "rendezvous waiting for an earlier one"
	if err = acquire(ctx, p.rdvSem, "an earlier rendezvous of the pool ran"); err != nil {
		f.Close()
	} else {
		defer func() { <-p.rdvSem }()
		p.rdvCount++
		what = fmt.Sprintf("rendezvous %d", p.rdvCount)
		if err = p.usable(); err != nil { // broken by the one before
			f.Close()
		} else {
			h, err = p.rendezvous(ctx, b, mine, f)
		}
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	b.cancelRdv = nil
	if err == nil && b.freed {
		// Free ran after the last step: peers hold their mappings of
		// this rank's memory, as after any Free; this rank's go.
		h.unmap()
		err = b.freedErr("rendezvous")
	}
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = &tagged{msg: err.Error(), is: []error{err, cause}}
		}
		err = fmt.Errorf("symm: group %q rank %d, %s (%d bytes): %w", p.cfg.Group, p.cfg.Rank, what, b.size, err)
		if agreed := errors.Is(err, ErrMismatch) || errors.Is(err, errAgreed); !agreed || errors.Is(err, ErrTimeout) {
			p.breakWith(err)
		}
		return nil, err
	}
	b.handle.Store(h)
	return h, nil
}

// share makes what this rank publishes for b, and the descriptor peers of
// other processes pull: its export (owned by the caller) and, with a
// LocalSharer backend, its token for peers of this process. b.mu is held.
func (p *Pool) share(b *Buffer) (rdvInfo, *os.File, error) {
	mine := rdvInfo{Bytes: b.size, Chunk: b.chunkSize}
	f, err := b.chunk.Export()
	if err != nil {
		return mine, nil, err
	}
	if local, ok := p.be.(LocalSharer); ok {
		tok, err := local.ShareLocal(b.chunk)
		if err != nil {
			f.Close()
			return mine, nil, err
		}
		mine.Proc, mine.Local = procID, tok
	}
	return mine, f, nil
}

// acquire takes the one-slot semaphore sem, waiting while ctx lasts: its
// end is ctx's cause, a deadline also ErrTimeout ("the deadline passed
// while " + what).
func acquire(ctx context.Context, sem chan struct{}, what string) error {
	select {
	case sem <- struct{}{}: // free: taken whatever ctx says
		return nil
	default:
	}
	select {
	case sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		err := context.Cause(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			err = &tagged{msg: "the deadline passed while " + what, is: []error{ErrTimeout, err}}
		}
		return err
	}
}

// rendezvous is Rendezvous's collective part: it offers f (and closes it),
// exchanges mine, maps every peer and agrees on the outcome. p.rdvSem and
// b.rdv are held, b.mu is not: it reads only b's fixed fields.
func (p *Pool) rendezvous(ctx context.Context, b *Buffer, mine rdvInfo, f *os.File) (*Handle, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	rank, world := p.cfg.Rank, p.cfg.WorldSize
	// Offered before publishing, withdrawn (and closed) after the second
	// exchange: by then every rank has pulled it or given up.
	mine.Seq = p.offer(f)
	defer p.withdraw(mine.Seq)
	local, _ := p.be.(LocalSharer)
	infos := make([]rdvInfo, world)
	_, _, err := exchange(ctx, p.cfg.Store, p.ns+"rdv/", rank, world, mustJSON(mine), func(r int, raw []byte) error {
		var in rdvInfo
		if err := json.Unmarshal(raw, &in); err != nil {
			return fmt.Errorf("rank %d's entry: %w", r, err)
		}
		if in.Bytes != mine.Bytes {
			return mismatchf("rank %d's buffer has %d bytes but rank %d's (this rank's) has %d; every rank must rendezvous on buffers of one size, in the same order",
				r, in.Bytes, rank, mine.Bytes)
		}
		if in.Chunk != mine.Chunk {
			return mismatchf("rank %d's chunk has %d bytes but rank %d's (this rank's) has %d (backends of different granularity)",
				r, in.Chunk, rank, mine.Chunk)
		}
		infos[r] = in
		return nil
	})
	if err != nil {
		return nil, err
	}

	h := &Handle{buf: b, rank: rank, world: world, channels: p.cfg.Channels, timeout: p.cfg.Timeout,
		ptrs: make([]uintptr, world), pads: make([]uintptr, world), maps: make([]Mapping, world)}
	failed := p.mapPeers(ctx, b, h, infos, local)
	if testHook != nil {
		testHook(rank, "rdv:mapped")
	}
	// Everyone reports, so a rank that failed takes the others down with
	// it instead of leaving them with a half-formed handle.
	status := rdvStatus{}
	if failed != nil {
		status.Err = failed.Error()
	}
	var theirs error
	_, _, err = exchange(ctx, p.cfg.Store, p.ns+"mapped/", rank, world, mustJSON(status), func(r int, raw []byte) error {
		var st rdvStatus
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("rank %d's status: %w", r, err)
		}
		if st.Err != "" && r != rank && theirs == nil {
			theirs = fmt.Errorf("rank %d failed: %s", r, st.Err)
		}
		return nil
	})
	switch {
	case err != nil:
		err = errors.Join(failed, err)
	case failed != nil || theirs != nil:
		// Every rank completed both exchanges and saw the same reports:
		// they failed together, and the pool stays usable.
		err = &tagged{msg: errors.Join(failed, theirs).Error(), is: []error{errAgreed, errors.Join(failed, theirs)}}
	}
	if err != nil {
		h.unmap()
		return nil, err
	}
	return h, nil
}

// errAgreed marks a Rendezvous failure every rank reached together (a
// rank's mapping failed and all reported it): the pool is not broken.
var errAgreed = errors.New("symm: every rank failed the rendezvous together")

// mapPeers maps every peer's chunk into h (through ImportLocal for peers
// of this process, else the descriptor pulled from the peer's server),
// fills its address arrays, and copies them to the device where the
// backend keeps device memory, all before the ranks report their outcome:
// any failure here fails every rank.
func (p *Pool) mapPeers(ctx context.Context, b *Buffer, h *Handle, infos []rdvInfo, local LocalSharer) error {
	s, err := p.persistentSlot(b)
	if err != nil {
		return err
	}
	for r := range h.world {
		if r == h.rank {
			continue
		}
		var at uintptr
		if s != nil {
			at = s.peers[r]
		}
		var m Mapping
		var err error
		if local != nil && infos[r].Proc == procID {
			m, err = local.ImportLocal(infos[r].Local, b.chunkSize, at)
		} else {
			m, err = p.pull(ctx, r, infos[r].Seq, b.chunkSize, at)
		}
		if err != nil {
			return fmt.Errorf("map rank %d's memory: %w", r, err)
		}
		h.maps[r] = m
	}
	for r := range h.world {
		base := b.addr
		if r != h.rank {
			base = h.maps[r].Addr()
		}
		h.ptrs[r] = base
		h.pads[r] = base + uintptr(b.padOff)
	}
	dm, ok := p.be.(DeviceArrayMaker)
	if !ok {
		return nil
	}
	if s != nil {
		p.mu.Lock()
		h.ptrsDev, h.padsDev = s.ptrsDev, s.padsDev
		p.mu.Unlock()
		if h.ptrsDev != 0 { // the same addresses as the first Rendezvous's
			return nil
		}
	}
	var frees []func() error
	for _, a := range []struct {
		dst *uintptr
		src []uintptr
	}{{&h.ptrsDev, h.ptrs}, {&h.padsDev, h.pads}} {
		addr, free, err := dm.DeviceArray(a.src)
		if err != nil {
			for _, f := range frees {
				f()
			}
			h.ptrsDev, h.padsDev = 0, 0
			return fmt.Errorf("copy the pointer arrays to the device: %w", err)
		}
		*a.dst = addr
		frees = append(frees, free)
	}
	if s == nil {
		h.freeDev = frees
		return nil
	}
	p.mu.Lock() // the slot keeps them until Close
	s.ptrsDev, s.padsDev, s.freeDev = h.ptrsDev, h.padsDev, frees
	p.mu.Unlock()
	return nil
}

// persistentSlot returns b's slot when b is persistent, with a reservation
// for each peer's chunk made on its first Rendezvous; nil for other
// buffers.
func (p *Pool) persistentSlot(b *Buffer) (*slot, error) {
	if !b.persistent {
		return nil, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.persist[b.id]
	if s == nil || s.buf != b {
		return nil, fmt.Errorf("%w: persistent id %d has no slot for this buffer", ErrFreed, b.id)
	}
	if s.peers != nil {
		return s, nil
	}
	peers := make([]uintptr, p.cfg.WorldSize)
	for r := range peers {
		if r == p.cfg.Rank {
			continue
		}
		a, err := p.be.Reserve(s.chunk)
		if err != nil {
			for _, a := range peers {
				if a != 0 {
					p.be.Release(a, s.chunk)
				}
			}
			return nil, fmt.Errorf("reserve an address range for rank %d's chunk: %w", r, err)
		}
		peers[r] = a
	}
	s.peers = peers
	return s, nil
}

// unmap drops the peer mappings and the device arrays; no one else uses
// them (the buffer's write lock is held, or h was never handed out).
func (h *Handle) unmap() error {
	var errs []error
	for _, free := range h.freeDev {
		errs = append(errs, free())
	}
	h.freeDev = nil
	for _, m := range h.maps {
		if m != nil {
			errs = append(errs, m.Unmap())
		}
	}
	return errors.Join(errs...)
}

// Buffer is the local buffer the handle belongs to.
func (h *Handle) Buffer() *Buffer { return h.buf }

// Rank is this rank.
func (h *Handle) Rank() int { return h.rank }

// WorldSize is the number of ranks.
func (h *Handle) WorldSize() int { return h.world }

// Channels is the number of signal channels.
func (h *Handle) Channels() int { return h.channels }

// Peer returns the address of rank's buffer in this process (this rank's
// own buffer for rank == Rank()). On the host twin it is a CPU address;
// on the GPU backend a device address usable in kernels and copies. It
// panics if rank is out of range, like a slice index.
func (h *Handle) Peer(rank int) uintptr { return h.ptrs[rank] }

// PeerBytes is rank's buffer as a slice when the backend's memory is host
// accessible, nil otherwise or once the buffer is freed. Loads and stores
// through it are plain: order them with signals (PutSignal after writing,
// WaitSignal before reading).
func (h *Handle) PeerBytes(rank int) []byte {
	h.buf.mu.RLock()
	defer h.buf.mu.RUnlock()
	if h.buf.freed || !h.buf.pool.be.HostAccessible() {
		return nil
	}
	return unsafe.Slice((*byte)(ptrAt(h.ptrs[rank])), h.buf.size)
}

// BufferPtrs returns every rank's buffer address in this process, indexed
// by rank (a copy). BufferPtrsDev is the same array in device memory, for
// custom kernels.
func (h *Handle) BufferPtrs() []uintptr { return append([]uintptr(nil), h.ptrs...) }

// SignalPadPtrs returns every rank's signal pad address in this process,
// indexed by rank (a copy); see Handle for the pad's layout.
func (h *Handle) SignalPadPtrs() []uintptr { return append([]uintptr(nil), h.pads...) }

// BufferPtrsDev is the device address of an array of WorldSize 8-byte
// pointers, BufferPtrs as a kernel sees it (cg_symm_group.buffers in
// collgen_symm.cuh). It is copied to device memory once, at Rendezvous,
// and freed by the buffer's Free: do not use it afterwards. A persistent
// id keeps it (and every address in it) for all its buffers, until the
// pool's Close (AllocPersistent). 0 when the backend has no device memory
// (the host twin).
func (h *Handle) BufferPtrsDev() uintptr { return h.ptrsDev }

// SignalPadPtrsDev is SignalPadPtrs in device memory, like BufferPtrsDev
// (cg_symm_group.pads).
func (h *Handle) SignalPadPtrsDev() uintptr { return h.padsDev }

// PutSignal signals peer on channel ch: it sets this rank's word in the
// peer's pad, first waiting (up to timeout) for the peer to have consumed
// the previous signal. Stores this rank made before it are visible to the
// peer once its WaitSignal returns. A zero timeout means the pool's; a
// negative one is refused (ErrInvalidArgument), as is a peer or channel
// out of range.
func (h *Handle) PutSignal(o Ordering, peer, ch int, timeout time.Duration) error {
	if err := h.check(peer, ch, timeout); err != nil {
		return err
	}
	return h.signal(o, &SignalOp{Kind: SignalPut, Rank: h.rank, Channel: ch, Peers: []int{peer},
		Put: []uintptr{h.word(peer, ch, h.rank)}, Timeout: h.bound(timeout)})
}

// WaitSignal waits (up to timeout) for peer's signal on channel ch and
// consumes it. A peer that does not signal in time is a *TimeoutError
// naming it and the channel.
func (h *Handle) WaitSignal(o Ordering, peer, ch int, timeout time.Duration) error {
	if err := h.check(peer, ch, timeout); err != nil {
		return err
	}
	return h.signal(o, &SignalOp{Kind: SignalWait, Rank: h.rank, Channel: ch, Peers: []int{peer},
		Wait: []uintptr{h.word(h.rank, ch, peer)}, Timeout: h.bound(timeout)})
}

// Barrier signals every other rank on channel ch and then waits for every
// other rank's signal, all within timeout. It is a full barrier for the
// memory of all ranks: what any rank stored before its Barrier is visible
// to every rank after its own. Consecutive barriers may use one channel.
func (h *Handle) Barrier(o Ordering, ch int, timeout time.Duration) error {
	if err := h.check(h.rank, ch, timeout); err != nil {
		return err
	}
	n := h.world - 1
	op := &SignalOp{Kind: SignalBarrier, Rank: h.rank, Channel: ch, Timeout: h.bound(timeout),
		Peers: make([]int, 0, n), Put: make([]uintptr, 0, n), Wait: make([]uintptr, 0, n)}
	for r := range h.world {
		if r == h.rank {
			continue
		}
		op.Peers = append(op.Peers, r)
		op.Put = append(op.Put, h.word(r, ch, h.rank))
		op.Wait = append(op.Wait, h.word(h.rank, ch, r))
	}
	return h.signal(o, op)
}

// check refuses a peer, channel or timeout out of range.
func (h *Handle) check(peer, ch int, timeout time.Duration) error {
	if peer < 0 || peer >= h.world {
		return invalidf("symm: peer %d is out of range for world size %d", peer, h.world)
	}
	if ch < 0 || ch >= h.channels {
		return invalidf("symm: channel %d is out of range: the pool has %d channels", ch, h.channels)
	}
	if timeout < 0 {
		return invalidf("symm: negative timeout %v: want 0 (the pool's, %v) or more", timeout, h.timeout)
	}
	return nil
}

// bound turns a zero timeout into the pool's.
func (h *Handle) bound(timeout time.Duration) time.Duration {
	if timeout == 0 {
		return h.timeout
	}
	return timeout
}

// word is the address, in this process, of sender's word for channel ch
// in owner's pad.
func (h *Handle) word(owner, ch, sender int) uintptr {
	return h.pads[owner] + uintptr(4*(ch*h.world+sender))
}

// signal runs op while holding the buffer's read lock, so the pads stay
// mapped until it returns.
func (h *Handle) signal(o Ordering, op *SignalOp) error {
	h.buf.mu.RLock()
	defer h.buf.mu.RUnlock()
	if err := h.buf.freedErr("signal " + op.Kind.String()); err != nil {
		return err
	}
	op.stop = &h.buf.stopping
	err := h.buf.pool.be.Signal(o, op)
	if errors.Is(err, errSignalStopped) {
		what := fmt.Sprintf("symm: rank %d %s on channel %d of the buffer at %#x", op.Rank, op.Kind, op.Channel, h.buf.addr)
		if h.buf.stopping.Load() == stopByClose {
			return &tagged{msg: what + ": ended by its pool's Close", is: []error{ErrClosed, ErrFreed}}
		}
		return fmt.Errorf("%w: %s: ended by the buffer's Free", ErrFreed, what)
	}
	return err
}
