// Package alloc is a caching device allocator with segment hooks, after
// PyTorch's CUDA caching allocator: it takes large segments from the driver,
// splits blocks out of them, and keeps freed blocks for reuse instead of
// returning them to the driver (cuMemFree synchronises the device).
//
// Streams: every segment, and so every block, belongs to the stream it was
// first allocated for, and a freed block is reused only by allocations on
// that stream, so reuse is ordered after the previous user's work without
// any wait. A block also used on other streams (RecordStream) is held back
// at Free until an event recorded on each of those streams has passed.
//
// Observers see every segment the allocator obtains (SegmentAllocated) and
// every segment it is about to give back (SegmentFreeing, called before the
// memory is freed), which is what NCCL buffer registration needs: runtime/comm
// registers each segment with its NCCL communicator and deregisters it before
// the free. Observe can replay the segments that already exist, atomically
// with subscribing, so an observer never misses or double-counts one.
//
// The allocator reaches the device only through Driver, so CPU tests run it
// over a fake; NewCUDA (cgo builds) drives a real device.
package alloc

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/collgen/collgen/runtime/cuda"
)

// Driver is what the allocator needs from a device.
type Driver interface {
	// Alloc obtains a segment of bytes of device memory.
	Alloc(bytes int64) (cuda.DevicePtr, error)
	// Free gives a segment back.
	Free(p cuda.DevicePtr) error
	// Record enqueues an event on s marking the work queued so far.
	Record(s *cuda.Stream) (Event, error)
}

// Event is a point in a stream's work (Driver.Record).
type Event interface {
	// Done reports whether the stream has passed the event.
	Done() (bool, error)
	// Wait blocks until the stream has passed the event.
	Wait() error
	// Release destroys the event.
	Release() error
}

// Observer is told about segments. Its methods run with the allocator's
// lock held, in the goroutine that caused them: they must not call the
// allocator back, and they should be quick (a local registration). One
// that panics leaves the allocator consistent (the segment it was told
// about stays listed, counted and, for SegmentAllocated, cached for
// reuse; for SegmentFreeing, not freed) and the panic goes on to the
// caller.
type Observer interface {
	// SegmentAllocated: seg was obtained from the driver (or, on Observe
	// with replay, already existed).
	SegmentAllocated(seg Segment)
	// SegmentFreeing: seg is about to be freed; its memory is still valid
	// until this returns.
	SegmentFreeing(seg Segment)
}

// ErrInvalidArgument marks a misuse of the allocator: a bad size, a block
// freed twice (also through a stale handle, whose memory Alloc handed out
// again under a new one) or freed through another allocator, a closed
// allocator.
var ErrInvalidArgument = errors.New("alloc: invalid use")

// OutOfMemoryError is an allocation the driver refused even after the
// allocator waited for the blocks held back for other streams and gave
// back every cached segment it could. Err joins the driver's error and any
// error of that clean-up.
type OutOfMemoryError struct {
	Bytes    int64 // the request, rounded
	Reserved int64 // bytes held in segments when it failed
	Err      error // the driver's error
}

// Error names the request and what the allocator holds.
func (e *OutOfMemoryError) Error() string {
	return fmt.Sprintf("alloc: out of device memory allocating %d bytes (%d bytes reserved in segments, cache emptied): %v", e.Bytes, e.Reserved, e.Err)
}

// Unwrap returns the driver's error.
func (e *OutOfMemoryError) Unwrap() error { return e.Err }

// Options tune an Allocator; zero values take the defaults.
type Options struct {
	// MinBlock is the rounding of every request (default 512 bytes): a
	// power of two, at most SegmentBytes.
	MinBlock int64
	// SegmentBytes is the smallest segment and the rounding of larger
	// ones (default 2 MiB), a multiple of MinBlock of at most
	// MaxSegmentBytes. A request larger than it gets a segment of its own
	// size, rounded up.
	SegmentBytes int64
}

// MaxSegmentBytes bounds Options.SegmentBytes (256 TiB, past any device),
// so that rounding the largest request (1<<62 bytes) cannot overflow.
const MaxSegmentBytes = 1 << 48

// Allocator is a caching device allocator over one Driver (one device).
// Safe for concurrent use.
type Allocator struct {
	drv  Driver
	opts Options

	mu        sync.Mutex
	closed    bool
	segments  []*segment // sorted by base
	free      map[*cuda.Stream][]*Block
	pending   []pendingFree
	observers []*observerEntry
	stats     Stats
	// eventErrs are errors of blocks' events (pendingFree), kept for
	// EmptyCache and Close to report: a block whose event failed is kept
	// out of use for good instead of failing every Alloc.
	eventErrs []error
}

// segment is one driver allocation; blocks tile it in address order.
type segment struct {
	base   cuda.DevicePtr
	bytes  int64
	stream *cuda.Stream
	blocks []*Block // address order, covering [base, base+bytes)
}

// Block is a piece of a segment, handed out by Alloc.
type Block struct {
	seg       *segment
	ptr       cuda.DevicePtr
	size      int64
	requested int64
	allocated bool
	pending   bool           // freed, waiting for other streams' events
	retired   bool           // a stale handle: its memory went out again under another (Alloc)
	uses      []*cuda.Stream // streams other than the segment's (RecordStream)
}

// Ptr is the block's device address.
func (b *Block) Ptr() cuda.DevicePtr { return b.ptr }

// Size is the block's size in bytes (the request rounded up).
func (b *Block) Size() int64 { return b.size }

// Stream is the stream the block belongs to.
func (b *Block) Stream() *cuda.Stream { return b.seg.stream }

// pendingFree is a freed block waiting for events on other streams.
type pendingFree struct {
	b      *Block
	events []Event
}

type observerEntry struct{ o Observer }

// New makes an allocator over drv.
func New(drv Driver, opts Options) (*Allocator, error) {
	if drv == nil {
		return nil, fmt.Errorf("%w: nil Driver", ErrInvalidArgument)
	}
	if err := checkDriver(drv); err != nil {
		return nil, err
	}
	if opts.MinBlock == 0 {
		opts.MinBlock = 512
	}
	if opts.SegmentBytes == 0 {
		opts.SegmentBytes = 2 << 20
	}
	if opts.MinBlock < 0 || opts.MinBlock&(opts.MinBlock-1) != 0 || opts.SegmentBytes < opts.MinBlock || opts.SegmentBytes%opts.MinBlock != 0 ||
		opts.SegmentBytes > MaxSegmentBytes {
		return nil, fmt.Errorf("%w: MinBlock %d must be a power of two and SegmentBytes %d a multiple of it, at most %d (MaxSegmentBytes)", ErrInvalidArgument, opts.MinBlock, opts.SegmentBytes, MaxSegmentBytes)
	}
	return &Allocator{drv: drv, opts: opts, free: map[*cuda.Stream][]*Block{}}, nil
}

func roundUp(n, a int64) int64 { return (n + a - 1) / a * a }

// Alloc returns a block of at least bytes for use on stream s (nil: the
// legacy default stream). A cached free block of s is reused (best fit,
// split when the rest is at least MinBlock); otherwise a new segment is
// obtained, and when the driver refuses, cached segments are given back
// and the allocation retried once.
func (a *Allocator) Alloc(bytes int64, s *cuda.Stream) (*Block, error) {
	if bytes <= 0 {
		return nil, fmt.Errorf("%w: alloc of %d bytes", ErrInvalidArgument, bytes)
	}
	if bytes > 1<<62 {
		return nil, fmt.Errorf("%w: alloc of %d bytes is too large", ErrInvalidArgument, bytes)
	}
	size := roundUp(bytes, a.opts.MinBlock)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, fmt.Errorf("%w: alloc on a closed allocator", ErrInvalidArgument)
	}
	a.collectPending(false)
	b := a.bestFit(size, s)
	if b == nil {
		var err error
		if b, err = a.newSegment(size, s); err != nil {
			return nil, err
		}
	}
	a.split(b, size)
	// A fresh handle for the memory: one freed before and handed out again
	// must not reach it through its old handle (a second Free of that
	// handle would free the new owner's block).
	h := &Block{seg: b.seg, ptr: b.ptr, size: b.size}
	b.seg.blocks[slices.Index(b.seg.blocks, b)] = h
	b.retired = true
	b = h
	b.allocated, b.requested = true, bytes
	a.stats.AllocatedBytes += b.size
	a.stats.ActiveBlocks++
	a.stats.NumAllocs++
	a.stats.PeakAllocatedBytes = max(a.stats.PeakAllocatedBytes, a.stats.AllocatedBytes)
	return b, nil
}

// bestFit removes and returns the smallest free block of s that holds size.
func (a *Allocator) bestFit(size int64, s *cuda.Stream) *Block {
	pool := a.free[s]
	i := sort.Search(len(pool), func(i int) bool { return pool[i].size >= size })
	if i == len(pool) {
		return nil
	}
	b := pool[i]
	a.free[s] = slices.Delete(pool, i, i+1)
	return b
}

// newSegment obtains a segment for size on s, tells the observers and
// returns its one block, out of s's free pool. When the driver refuses, it
// waits for the blocks held back for other streams and gives back what
// the cache holds; a block of s released by that wait that holds size (in
// a segment that stays, as others of its blocks are in use) is returned
// instead of a new segment.
func (a *Allocator) newSegment(size int64, s *cuda.Stream) (*Block, error) {
	bytes := roundUp(size, a.opts.SegmentBytes)
	p, err := a.drv.Alloc(bytes)
	if err != nil {
		// Wait for the blocks held back for other streams, give back what
		// the cache holds, and try once more.
		// collectPending keeps its errors itself; releaseCached's are
		// kept here when the allocation succeeds after all.
		perr := a.collectPending(true)
		rerr := a.releaseCached()
		a.stats.NumOOMRetries++
		if b := a.bestFit(size, s); b != nil {
			if rerr != nil {
				a.eventErrs = append(a.eventErrs, rerr)
			}
			return b, nil
		}
		if p, err = a.drv.Alloc(bytes); err != nil {
			return nil, &OutOfMemoryError{Bytes: bytes, Reserved: a.stats.ReservedBytes, Err: errors.Join(err, perr, rerr)}
		}
		if rerr != nil {
			a.eventErrs = append(a.eventErrs, rerr)
		}
	}
	seg := &segment{base: p, bytes: bytes, stream: s}
	seg.blocks = []*Block{{seg: seg, ptr: p, size: bytes}}
	a.addFree(seg.blocks[0])
	i := sort.Search(len(a.segments), func(i int) bool { return a.segments[i].base > p })
	a.segments = slices.Insert(a.segments, i, seg)
	a.stats.ReservedBytes += bytes
	a.stats.Segments++
	a.stats.NumSegmentAllocs++
	a.stats.PeakReservedBytes = max(a.stats.PeakReservedBytes, a.stats.ReservedBytes)
	info := seg.info()
	for _, e := range a.observers {
		e.o.SegmentAllocated(info)
	}
	a.removeFree(seg.blocks[0])
	return seg.blocks[0], nil
}

// split cuts b to size, returning the rest to the free pool when it is at
// least MinBlock (requests are rounded to MinBlock, so it always is).
func (a *Allocator) split(b *Block, size int64) {
	rest := b.size - size
	if rest < a.opts.MinBlock {
		return
	}
	nb := &Block{seg: b.seg, ptr: b.ptr + cuda.DevicePtr(size), size: rest}
	b.size = size
	i := slices.Index(b.seg.blocks, b)
	b.seg.blocks = slices.Insert(b.seg.blocks, i+1, nb)
	a.addFree(nb)
}

// addFree puts b in its stream's pool, sorted by size then address.
func (a *Allocator) addFree(b *Block) {
	pool := a.free[b.seg.stream]
	i := sort.Search(len(pool), func(i int) bool {
		return pool[i].size > b.size || pool[i].size == b.size && pool[i].ptr > b.ptr
	})
	a.free[b.seg.stream] = slices.Insert(pool, i, b)
}

// removeFree takes b out of its stream's pool.
func (a *Allocator) removeFree(b *Block) {
	pool := a.free[b.seg.stream]
	if i := slices.Index(pool, b); i >= 0 {
		a.free[b.seg.stream] = slices.Delete(pool, i, i+1)
	}
}

// RecordStream marks b as used on s too (a stream other than its own), so
// Free holds it back until the work queued on s so far has finished.
func (a *Allocator) RecordStream(b *Block, s *cuda.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkLive(b, "RecordStream"); err != nil {
		return err
	}
	if s != b.seg.stream && !slices.Contains(b.uses, s) {
		b.uses = append(b.uses, s)
	}
	return nil
}

func (a *Allocator) checkLive(b *Block, op string) error {
	switch {
	case b == nil:
		return fmt.Errorf("%w: %s of a nil block", ErrInvalidArgument, op)
	case b.seg == nil || !slices.Contains(a.segments, b.seg):
		return fmt.Errorf("%w: %s of block %#x: not from this allocator (or its segment was freed)", ErrInvalidArgument, op, uintptr(b.ptr))
	case b.retired:
		return fmt.Errorf("%w: %s of block %#x: a stale handle (freed, and its memory handed out again under another)", ErrInvalidArgument, op, uintptr(b.ptr))
	case !b.allocated || b.pending:
		return fmt.Errorf("%w: %s of block %#x: already freed", ErrInvalidArgument, op, uintptr(b.ptr))
	}
	return nil
}

// Free returns b to the cache. A block used on other streams
// (RecordStream) becomes reusable once events recorded now on each of
// them have passed; otherwise at once (for its own stream's later work).
func (a *Allocator) Free(b *Block) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkLive(b, "Free"); err != nil {
		return err
	}
	pf := pendingFree{b: b}
	for _, s := range b.uses {
		ev, err := a.drv.Record(s)
		if err != nil {
			// Without an event the block cannot be known unused: it stays
			// allocated (and counted), and the caller may Free it again.
			for _, e := range pf.events {
				e.Release()
			}
			return fmt.Errorf("alloc: free of block %#x: record event: %w; the block stays allocated", uintptr(b.ptr), err)
		}
		pf.events = append(pf.events, ev)
	}
	a.stats.AllocatedBytes -= b.size
	a.stats.ActiveBlocks--
	a.stats.NumFrees++
	if len(pf.events) == 0 {
		a.release(b)
		return nil
	}
	b.pending = true
	a.pending = append(a.pending, pf)
	return nil
}

// release makes b free and merges it with free neighbours in its segment.
func (a *Allocator) release(b *Block) {
	b.allocated, b.pending, b.uses, b.requested = false, false, nil, 0
	blocks := b.seg.blocks
	i := slices.Index(blocks, b)
	if i+1 < len(blocks) && a.isFree(blocks[i+1]) {
		n := blocks[i+1]
		a.removeFree(n)
		b.size += n.size
		blocks = slices.Delete(blocks, i+1, i+2)
	}
	if i > 0 && a.isFree(blocks[i-1]) {
		p := blocks[i-1]
		a.removeFree(p)
		p.size += b.size
		blocks = slices.Delete(blocks, i, i+1)
		b = p
	}
	b.seg.blocks = blocks
	a.addFree(b)
}

func (a *Allocator) isFree(b *Block) bool { return !b.allocated && !b.pending }

// collectPending releases pending blocks whose events have passed (all of
// them, waiting, with wait). A block whose event fails can never be known
// unused: it leaves the pending list but stays out of use, its segment
// kept, and the error, naming the block, joins eventErrs (reported by
// EmptyCache and Close) instead of failing the caller. It returns the
// errors of this call.
func (a *Allocator) collectPending(wait bool) error {
	var errs []error
	keep := a.pending[:0]
	for _, pf := range a.pending {
		done, failed := true, false
		for _, e := range pf.events {
			var err error
			ok := true
			if wait {
				err = e.Wait()
			} else {
				ok, err = e.Done()
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("alloc: block %#x (%d bytes) freed for use on other streams: its event failed, so it is kept out of use: %w", uintptr(pf.b.ptr), pf.b.size, err))
				failed = true
			}
			if !ok || err != nil {
				done = false
				break
			}
		}
		if !done && !failed {
			keep = append(keep, pf)
			continue
		}
		for _, e := range pf.events {
			if err := e.Release(); err != nil {
				errs = append(errs, fmt.Errorf("alloc: release an event of block %#x: %w", uintptr(pf.b.ptr), err))
			}
		}
		if done {
			a.release(pf.b)
		}
	}
	clear(a.pending[len(keep):])
	a.pending = keep
	a.eventErrs = append(a.eventErrs, errs...)
	return errors.Join(errs...)
}

// takeEventErrs returns the event errors kept so far, and forgets them.
func (a *Allocator) takeEventErrs() error {
	err := errors.Join(a.eventErrs...)
	a.eventErrs = nil
	return err
}

// EmptyCache waits for blocks held back for other streams, then gives
// every segment with no allocated block back to the driver (observers
// first). Blocks in use keep their segments. Its error includes the event
// errors kept since the last EmptyCache (see collectPending).
func (a *Allocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.collectPending(true)
	return errors.Join(a.takeEventErrs(), a.releaseCached())
}

// releaseCached frees every segment made of one free block. Each segment
// leaves the list (and the counts) only after its observers have run, so
// an observer's panic leaves it listed and not freed.
func (a *Allocator) releaseCached() error {
	var errs []error
	var gone []*segment
	for _, seg := range a.segments {
		if len(seg.blocks) == 1 && a.isFree(seg.blocks[0]) {
			gone = append(gone, seg)
		}
	}
	for _, seg := range gone {
		info := seg.info()
		for _, e := range a.observers {
			e.o.SegmentFreeing(info)
		}
		a.removeFree(seg.blocks[0])
		a.segments = slices.DeleteFunc(a.segments, func(x *segment) bool { return x == seg })
		if err := a.drv.Free(seg.base); err != nil {
			errs = append(errs, fmt.Errorf("alloc: free segment %#x (%d bytes): %w", uintptr(seg.base), seg.bytes, err))
		}
		a.stats.ReservedBytes -= seg.bytes
		a.stats.Segments--
		a.stats.NumSegmentFrees++
	}
	for s, pool := range a.free {
		if len(pool) == 0 {
			delete(a.free, s)
		}
	}
	return errors.Join(errs...)
}

// Observe subscribes o. With replay, o.SegmentAllocated is first called
// for every segment that exists, under the same lock, so no segment is
// missed or seen twice. The returned function unsubscribes o (safe to call
// twice); it does not call SegmentFreeing. A nil o subscribes nothing
// (cancel does nothing).
func (a *Allocator) Observe(o Observer, replay bool) (cancel func()) {
	if o == nil {
		return func() {}
	}
	e := &observerEntry{o: o}
	a.mu.Lock()
	defer a.mu.Unlock()
	if replay {
		for _, seg := range a.segments {
			o.SegmentAllocated(seg.info())
		}
	}
	a.observers = append(a.observers, e)
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if i := slices.Index(a.observers, e); i >= 0 {
			a.observers = slices.Delete(a.observers, i, i+1)
		}
	}
}

// Stats are the allocator's counters.
type Stats struct {
	AllocatedBytes     int64 // in blocks handed out and not freed (rounded sizes)
	ReservedBytes      int64 // in segments
	ActiveBlocks       int   // blocks handed out and not freed
	Segments           int   // segments held
	PeakAllocatedBytes int64 // the most AllocatedBytes has been
	PeakReservedBytes  int64 // the most ReservedBytes has been
	NumAllocs          int64 // successful Alloc calls
	NumFrees           int64 // successful Free calls
	NumSegmentAllocs   int64 // driver allocations
	NumSegmentFrees    int64 // driver frees
	NumOOMRetries      int64 // times the cache was emptied to retry a refused allocation
}

// Stats returns the current counters.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// Segment describes one segment (Snapshot, observers).
type Segment struct {
	Base   cuda.DevicePtr // its first byte
	Bytes  int64          // its size
	Stream *cuda.Stream   // the stream it belongs to, and its blocks too
	Blocks []BlockInfo    // address order, tiling the segment
}

// BlockInfo describes one block of a segment.
type BlockInfo struct {
	Ptr       cuda.DevicePtr // its first byte
	Size      int64          // its size (a rounded request, or free space)
	Requested int64          // bytes asked for (0 when free)
	Allocated bool           // handed out (including freed but held for other streams)
}

func (s *segment) info() Segment {
	out := Segment{Base: s.base, Bytes: s.bytes, Stream: s.stream}
	for _, b := range s.blocks {
		out.Blocks = append(out.Blocks, BlockInfo{Ptr: b.ptr, Size: b.size, Requested: b.requested, Allocated: b.allocated})
	}
	return out
}

// Snapshot returns every segment with its blocks, by address.
func (a *Allocator) Snapshot() []Segment {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Segment, len(a.segments))
	for i, s := range a.segments {
		out[i] = s.info()
	}
	return out
}

// Close waits for pending frees and gives every segment back; it fails
// (freeing nothing) while blocks are still allocated. A closed allocator
// refuses Alloc (ErrInvalidArgument); Free of its last blocks, Stats and Snapshot
// still work. Its error includes the kept event errors, and names the
// segments it could not give back because a block's event failed. Close
// after a Close that returned nil does nothing and returns nil.
func (a *Allocator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.collectPending(true)
	if a.stats.ActiveBlocks > 0 {
		return fmt.Errorf("%w: Close with %d blocks (%d bytes) still allocated; free them first", ErrInvalidArgument, a.stats.ActiveBlocks, a.stats.AllocatedBytes)
	}
	a.closed = true
	err := errors.Join(a.takeEventErrs(), a.releaseCached())
	if n := len(a.segments); n > 0 {
		err = errors.Join(err, fmt.Errorf("alloc: %d segment(s) (%d bytes) kept: they hold blocks whose events failed", n, a.stats.ReservedBytes))
	}
	return err
}
