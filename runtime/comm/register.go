package comm

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/collgen/collgen/runtime/alloc"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// registrar is the NCCL side of buffer registration. The device
// implements it when NCCL is open (cudaDevice, over runtime/nccl); CPU
// tests fake it. It is an interface of its own, beside device, because
// only NCCL-backed devices have it.
type registrar interface {
	// checkMemory refuses memory NCCL cannot register (not device memory
	// of this rank's GPU from cuMemAlloc or the VMM API, or a range
	// running past its allocation), with the reason.
	checkMemory(p cuda.DevicePtr, bytes int64) error
	// register and deregister are ncclCommRegister and
	// ncclCommDeregister: local, no other rank takes part.
	register(p cuda.DevicePtr, bytes int64) (handle uintptr, err error)
	deregister(handle uintptr) error
	// registerWindow and deregisterWindow are ncclCommWindowRegister
	// (NCCL_WIN_COLL_SYMMETRIC), collective, every rank in the same order,
	// and ncclCommWindowDeregister, which in NCCL 2.27's source unmaps the
	// peers' mappings and deregisters locally, exchanging nothing
	// (docs/registration.md); ranks still deregister windows in
	// registration order (sortedLocked), should a later NCCL need it.
	registerWindow(p cuda.DevicePtr, bytes int64) (handle uintptr, err error)
	deregisterWindow(handle uintptr) error
	// noWindows says why the NCCL library has no windows (before 2.27),
	// or "".
	noWindows() string
	// noRegister says why the NCCL library cannot register buffers
	// (ncclCommRegister, before 2.19), or "".
	noRegister() string
}

// registration is one registered range.
type registration struct {
	base    cuda.DevicePtr
	bytes   int64
	handle  uintptr
	seq     int  // registration order (windows are deregistered in it)
	refs    int  // RegisterBuffer calls (and the allocator's hook, which counts once)
	window  bool // an NCCL window (RegisterWindow)
	segment bool // registered by the allocator's hook
	// pending marks a window addWindow holds the range for while the
	// ranks meet: no NCCL handle yet, nothing to deregister.
	pending bool
}

func (r *registration) end() cuda.DevicePtr { return r.base + cuda.DevicePtr(r.bytes) }

// registry is a communicator's bookkeeping of NCCL registrations, the one
// owner of every handle: it registers the allocator's segments through
// the hook (and those that exist when it attaches), refcounts repeated
// registrations of one range, deregisters a segment before the allocator
// frees it, and deregisters everything at Close and Abort.
//
// Locking: mu guards everything. The allocator calls the hook with its own
// lock held, so the registry never calls the allocator while holding mu
// (detach runs outside it). win, taken before mu, keeps window
// registrations one at a time, meeting and NCCL call together (every rank
// makes them in one order); mu is released for the meeting itself, which
// may wait up to Config.Timeout, so the hook, buffer registrations and
// deregistrations (a window's exchanges nothing with peers) go on
// meanwhile.
type registry struct {
	r    registrar
	rank int
	// join meets every rank before a window registration enters NCCL
	// (addWindow): each rank's note in, every rank's out, or an error (a
	// *rendezvous.MissingRanksError past Config.Timeout). abortNCCL
	// aborts the NCCL communicator. Both are set by attachRegistry; a
	// registry without join (fuzz tests) registers windows at once.
	join      func(ctx context.Context, note []byte) ([][]byte, error)
	abortNCCL func() error
	// stop ends a join in progress when closeAll begins (its cause:
	// ErrClosed or ErrAborted), so Close and Abort do not wait for it.
	stopped context.Context
	stop    context.CancelCauseFunc

	win    sync.Mutex
	mu     sync.Mutex
	regs   map[cuda.DevicePtr]*registration
	gone   map[cuda.DevicePtr]bool // deregistered bases, for the error message
	hookEr []error                 // failures inside the allocator's hook
	closed bool
	seq    int    // registrations made so far
	detach func() // unsubscribes from the allocator
	// failed is set once a window registration timed out and NCCL was
	// aborted: later window calls return it at once.
	failed error
}

// maxGone bounds the memory of deregistered bases kept for messages.
const maxGone = 4096

func newRegistry(r registrar, rank int) *registry {
	g := &registry{r: r, rank: rank, regs: map[cuda.DevicePtr]*registration{}, gone: map[cuda.DevicePtr]bool{}}
	g.stopped, g.stop = context.WithCancelCause(context.Background())
	return g
}

// attach registers every segment a has and subscribes to its hooks.
func (g *registry) attach(a *alloc.Allocator) {
	g.detach = a.Observe(g, true)
}

// SegmentAllocated is the allocator's hook: register the new segment. A
// failure does not fail the allocation (NCCL then copies through its own
// buffers); it is kept and reported by Close.
func (g *registry) SegmentAllocated(seg alloc.Segment) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	if err := g.addLocked(seg.Base, seg.Bytes, false, true); err != nil {
		g.hookEr = append(g.hookEr, err)
	}
}

// SegmentFreeing is the allocator's hook, called before the segment is
// freed: every registration inside it goes, whatever its count, since the
// memory it names is about to disappear.
func (g *registry) SegmentFreeing(seg alloc.Segment) {
	g.mu.Lock()
	defer g.mu.Unlock()
	end := seg.Base + cuda.DevicePtr(seg.Bytes)
	for _, reg := range g.sortedLocked() {
		if reg.base < end && reg.end() > seg.Base {
			if err := g.dropLocked(reg, false); err != nil {
				g.hookEr = append(g.hookEr, err)
			}
		}
	}
}

// add registers [p, p+bytes): a repeat of a registered range counts one
// more reference; a range overlapping another registration is refused.
func (g *registry) add(p cuda.DevicePtr, bytes int64, window bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errorf(ErrClosed, "comm: rank %d: register %#x on a closed communicator", g.rank, uintptr(p))
	}
	return g.addLocked(p, bytes, window, false)
}

func (g *registry) addLocked(p cuda.DevicePtr, bytes int64, window, segment bool) error {
	reg, err := g.checkLocked(p, bytes, window)
	if err != nil {
		return err
	}
	if reg != nil {
		reg.refs++
		reg.segment = reg.segment || segment
		return nil
	}
	return g.registerLocked(p, bytes, window, segment)
}

// checkLocked is add's refusals, before any NCCL call: it returns the
// registration a repeat of a registered range counts on, nil for a new
// one, or why the range cannot be registered.
func (g *registry) checkLocked(p cuda.DevicePtr, bytes int64, window bool) (*registration, error) {
	kind := "buffer"
	if window {
		kind = "window"
	}
	if p == 0 || bytes <= 0 || p+cuda.DevicePtr(bytes) < p {
		return nil, errorf(ErrInvalidArgument, "comm: rank %d: register %s %#x of %d bytes: need a device address and a positive size that ends inside the address space", g.rank, kind, uintptr(p), bytes)
	}
	if reg := g.regs[p]; reg != nil && !reg.pending && reg.bytes == bytes && reg.window == window {
		return reg, nil
	}
	end := p + cuda.DevicePtr(bytes)
	for _, reg := range g.regs {
		if reg.base < end && reg.end() > p {
			what := "a registered buffer"
			switch {
			case reg.pending:
				what = "a window being registered (RegisterWindow waits for the other ranks)"
			case reg.window:
				what = "a registered window"
			case reg.segment:
				what = "an allocator segment registered by the hook (its blocks need no registration of their own)"
			}
			return nil, errorf(ErrInvalidArgument, "comm: rank %d: register %s [%#x, %#x): overlaps %s [%#x, %#x); register whole allocations, once each (a repeat of the same range is counted)",
				g.rank, kind, uintptr(p), uintptr(end), what, uintptr(reg.base), uintptr(reg.end()))
		}
	}
	return nil, g.r.checkMemory(p, bytes)
}

// registerLocked makes a new registration checked by checkLocked.
func (g *registry) registerLocked(p cuda.DevicePtr, bytes int64, window, segment bool) error {
	kind := "buffer"
	if window {
		kind = "window"
	}
	g.seq++
	reg := &registration{base: p, bytes: bytes, seq: g.seq, refs: 1, window: window, segment: segment}
	var err error
	if window {
		reg.handle, err = g.r.registerWindow(p, bytes)
	} else {
		reg.handle, err = g.r.register(p, bytes)
	}
	if err != nil {
		return fmt.Errorf("comm: rank %d: register %s %#x of %d bytes: %w", g.rank, kind, uintptr(p), bytes, err)
	}
	g.regs[p] = reg
	delete(g.gone, p)
	return nil
}

// addWindow registers [p, p+bytes) as a window (RegisterWindow, and Alloc
// with Config.NCCLWindows). ncclCommWindowRegister is collective: on a
// blocking NCCL communicator a rank waits inside it, without bound, for
// every other rank to call it. So the ranks first meet through the store
// (join), bounded by Config.Timeout and ctx, each saying what it is about
// to do: a new window of its size, a repeat of one it registered, or a
// refusal (checkLocked). Only when every rank is there and all agree does
// any of them call NCCL; a refusal or disagreement is an error on every
// rank (ErrMismatch on those that did not refuse) and NCCL is not called.
// When a rank does not come in time, the call returns ErrTimeout naming
// the missing ranks and, as when an NCCL collective times out, the NCCL
// communicator is aborted: this rank's note is published, so a late rank
// may get past the meeting and wait in NCCL for this one, and the abort
// (closing this rank's NCCL connections) is what ends that wait. Later
// window calls then fail at once (ErrAborted). A rank that dies after the
// meeting but before its NCCL call still leaves the others in NCCL
// (blocking communicator only; Config.NCCLNonBlocking bounds that too).
//
// The registry's lock is released for the meeting (the range held by a
// pending registration, so nothing else registers over it) and the state
// checked again after it: Close or Abort meanwhile is ErrClosed or
// ErrAborted; the range gone (the allocator freed its memory) fails the
// call, and, where the peers go on into NCCL, aborts the NCCL communicator
// as a timeout does.
func (g *registry) addWindow(ctx context.Context, p cuda.DevicePtr, bytes int64) error {
	g.win.Lock()
	defer g.win.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errorf(ErrClosed, "comm: rank %d: register window %#x on a closed communicator", g.rank, uintptr(p))
	}
	if g.failed != nil {
		return g.failed
	}
	reg, refused := g.checkLocked(p, bytes, true)
	if g.join != nil {
		note := fmt.Sprintf("new %d", bytes)
		switch {
		case refused != nil:
			note = "refused: " + refused.Error()
		case reg != nil:
			note = fmt.Sprintf("repeat %d", bytes)
		}
		var held *registration
		if refused == nil && reg == nil {
			held = &registration{base: p, bytes: bytes, window: true, pending: true}
			g.regs[p] = held
		}
		jctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		defer context.AfterFunc(g.stopped, func() { cancel(context.Cause(g.stopped)) })()
		g.mu.Unlock()
		notes, err := g.join(jctx, []byte(note))
		g.mu.Lock()
		lost := (held != nil && g.regs[p] != held) || (reg != nil && g.regs[p] != reg)
		if held != nil && g.regs[p] == held {
			delete(g.regs, p)
		}
		if g.closed { // Close or Abort meanwhile: no NCCL call now
			cause := context.Cause(g.stopped)
			return errorf(cause, "comm: rank %d: RegisterWindow of %d bytes: %v while waiting for the other ranks", g.rank, bytes, cause)
		}
		if err != nil {
			return g.joinFailedLocked(jctx, bytes, err)
		}
		if refused == nil {
			for r, n := range notes {
				if string(n) != note {
					return errorf(ErrMismatch, "comm: rank %d: RegisterWindow of %d bytes: rank %d's is %q where this rank's is %q (every rank registers a window of one size, the same windows in the same order); no rank registered it", g.rank, bytes, r, n, note)
				}
			}
		}
		switch {
		case refused != nil:
		case lost && reg != nil: // a repeat: no rank calls NCCL
			return errorf(ErrInvalidArgument, "comm: rank %d: RegisterWindow of %d bytes at %#x: the window was deregistered (its memory freed) while the ranks met; no rank counted it again", g.rank, bytes, uintptr(p))
		case lost:
			return g.abortWindowsLocked(errorf(ErrInvalidArgument, "comm: rank %d: RegisterWindow of %d bytes at %#x: its memory was freed while the ranks met (the allocator's hook dropped the range); the NCCL communicator was aborted (the other ranks go on into NCCL and would wait there for this one), make a new Communicator", g.rank, bytes, uintptr(p)),
				"an earlier RegisterWindow's memory was freed while the ranks met")
		}
	}
	switch {
	case refused != nil:
		return refused
	case reg != nil:
		reg.refs++
		return nil
	}
	return g.registerLocked(p, bytes, true, false)
}

// abortWindowsLocked aborts the NCCL communicator after a window
// registration the other ranks may have gone on with failed on this one,
// so that later window calls fail at once (ErrAborted, saying why), and
// returns err with the abort's error.
func (g *registry) abortWindowsLocked(err error, why string) error {
	var aerr error
	if g.abortNCCL != nil {
		aerr = g.abortNCCL()
	}
	g.failed = errorf(ErrAborted, "comm: rank %d: window registration: the NCCL communicator was aborted when %s; make a new Communicator", g.rank, why)
	return errors.Join(err, classify(aerr))
}

// joinFailedLocked is addWindow's error when the ranks did not all meet:
// ErrClosed or ErrAborted when Close or Abort ended the wait, otherwise
// (a rank missing at the deadline, ctx ended, a store error) the failure
// with the NCCL communicator aborted; see addWindow.
func (g *registry) joinFailedLocked(ctx context.Context, bytes int64, err error) error {
	if cause := context.Cause(g.stopped); cause != nil && errors.Is(context.Cause(ctx), cause) {
		return errorf(cause, "comm: rank %d: RegisterWindow of %d bytes: %v while waiting for the other ranks", g.rank, bytes, cause)
	}
	var missing *rendezvous.MissingRanksError
	who := "not every rank"
	if errors.As(err, &missing) {
		s := make([]string, len(missing.Missing))
		for i, r := range missing.Missing {
			s[i] = strconv.Itoa(r)
		}
		who = "rank " + strings.Join(s, ", ")
		if len(s) > 1 {
			who = "ranks " + strings.Join(s, ", ")
		}
	}
	return g.abortWindowsLocked(classify(fmt.Errorf("comm: rank %d: RegisterWindow of %d bytes: %s did not join it (collective: every rank calls it, in the same order): %w; the NCCL communicator was aborted (a rank arriving later would wait in NCCL for this one), make a new Communicator", g.rank, bytes, who, err)),
		"an earlier RegisterWindow timed out ("+who+" did not join)")
}

// remove drops one reference to the registration at p, deregistering it
// with the last. An address that is not registered is an error saying
// whether it was deregistered before or never registered.
func (g *registry) remove(p cuda.DevicePtr, window bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	kind := "buffer"
	if window {
		kind = "window"
	}
	reg := g.regs[p]
	if reg != nil && reg.pending { // a window not registered yet
		reg = nil
	}
	switch {
	case g.closed:
		return errorf(ErrClosed, "comm: rank %d: deregister %s %#x on a closed communicator (Close and Abort deregister everything)", g.rank, kind, uintptr(p))
	case reg == nil && g.gone[p]:
		return errorf(ErrInvalidArgument, "comm: rank %d: deregister %s %#x: already deregistered", g.rank, kind, uintptr(p))
	case reg == nil:
		return errorf(ErrInvalidArgument, "comm: rank %d: deregister %s %#x: not registered (pass the address given to Register%s)", g.rank, kind, uintptr(p), map[bool]string{false: "Buffer", true: "Window"}[window])
	case reg.window != window:
		return errorf(ErrInvalidArgument, "comm: rank %d: deregister %s %#x: it is registered as a %s", g.rank, kind, uintptr(p), map[bool]string{false: "buffer", true: "window"}[reg.window])
	case reg.segment && reg.refs == 1:
		return errorf(ErrInvalidArgument, "comm: rank %d: deregister buffer %#x: it is an allocator segment, registered by the hook until the allocator frees it", g.rank, uintptr(p))
	}
	reg.refs--
	if reg.refs > 0 {
		return nil
	}
	return g.dropLocked(reg, false)
}

// dropLocked deregisters reg whatever its count. With abort, it is only
// forgotten: ncclCommAbort, which follows, frees every registration of
// the communicator, and a deregistration could wait behind an NCCL call
// in flight (runtime/nccl serialises them) for up to Config.Timeout,
// keeping Abort from being prompt; a window's is collective besides.
func (g *registry) dropLocked(reg *registration, abort bool) error {
	delete(g.regs, reg.base)
	if reg.pending { // addWindow sees it gone
		return nil
	}
	if len(g.gone) >= maxGone {
		clear(g.gone)
	}
	g.gone[reg.base] = true
	var err error
	switch {
	case abort:
	case reg.window:
		err = g.r.deregisterWindow(reg.handle)
	default:
		err = g.r.deregister(reg.handle)
	}
	if err != nil {
		return fmt.Errorf("comm: rank %d: deregister %#x: %w", g.rank, uintptr(reg.base), err)
	}
	return nil
}

// sortedLocked returns the registrations in registration order: windows,
// registered collectively in the same order on every rank, are then
// deregistered in the same order on every rank too (addresses differ).
func (g *registry) sortedLocked() []*registration {
	out := make([]*registration, 0, len(g.regs))
	for _, reg := range g.regs {
		out = append(out, reg)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out
}

// closeAll unsubscribes from the allocator and deregisters everything (see
// dropLocked for windows on abort). It returns the hook's failures too.
// Idempotent.
func (g *registry) closeAll(abort bool) error {
	if g == nil {
		return nil
	}
	if g.detach != nil {
		g.detach() // outside mu: the allocator's lock comes first
	}
	if abort {
		g.stop(ErrAborted) // a window registration waiting for peers ends now
	} else {
		g.stop(ErrClosed)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	errs := g.hookEr
	g.hookEr = nil
	for _, reg := range g.sortedLocked() {
		errs = append(errs, g.dropLocked(reg, abort))
	}
	return errors.Join(errs...)
}

// registered returns the registrations (tests).
func (g *registry) registered() []registration {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []registration
	for _, reg := range g.sortedLocked() {
		if !reg.pending {
			out = append(out, *reg)
		}
	}
	return out
}

// RegisterBuffer registers device memory [p, p+bytes) with the
// communicator's NCCL communicator (ncclCommRegister), so collectives the
// rules give to NCCL run on it without NCCL's internal copies. The memory
// must be device memory of this rank's GPU from cuMemAlloc or the VMM API
// (anything else is refused here, with the reason) and must stay allocated
// until DeregisterBuffer, Close or Abort. Registering the same range again
// counts a reference; a range overlapping another registration is refused.
// Segments of Config.Allocator are registered automatically. Local: other
// ranks do not take part. GPU communicators with NCCL open only.
func (c *Communicator) RegisterBuffer(p cuda.DevicePtr, bytes int64) error {
	reg, err := c.registry("RegisterBuffer")
	if err != nil {
		return err
	}
	if why := reg.r.noRegister(); why != "" {
		return errorf(ErrUnsupported, "comm: rank %d: RegisterBuffer: %s", c.cfg.Rank, why)
	}
	return classify(reg.add(p, bytes, false))
}

// DeregisterBuffer drops one reference to the registration made at p by
// RegisterBuffer; the last one deregisters it. An address that is not
// registered (never, or no more) is ErrInvalidArgument saying which.
func (c *Communicator) DeregisterBuffer(p cuda.DevicePtr) error {
	reg, err := c.registry("DeregisterBuffer")
	if err != nil {
		return err
	}
	return classify(reg.remove(p, false))
}

// RegisterWindow registers [p, p+bytes) as an NCCL window with
// NCCL_WIN_COLL_SYMMETRIC (ncclCommWindowRegister, NCCL 2.27+), so NCCL
// runs its symmetric kernels on collectives whose buffers lie in it. It is
// collective: every rank registers a buffer of the same size, in the same
// order. The memory must come from the VMM API, such as a buffer of a
// runtime/symm pool on the CUDA backend (NCCL refuses cuMemAlloc memory).
// Ranks first meet through the store, each saying what it registers, and
// call NCCL only when all are there and agree (a size differing between
// ranks, or a rank refusing its window, is an error on every rank and
// nothing is registered). A rank that does not come within Config.Timeout
// (or ctx) makes the others return ErrTimeout naming it, with the NCCL
// communicator aborted, as a timed-out NCCL collective leaves it; Abort
// ends the wait at once.
func (c *Communicator) RegisterWindow(ctx context.Context, p cuda.DevicePtr, bytes int64) error {
	reg, err := c.registry("RegisterWindow")
	if err != nil {
		return err
	}
	if why := reg.r.noWindows(); why != "" {
		return errorf(ErrUnsupported, "comm: rank %d: RegisterWindow: %s", c.cfg.Rank, why)
	}
	if err := ctx.Err(); err != nil {
		return classify(err)
	}
	return classify(reg.addWindow(ctx, p, bytes))
}

// DeregisterWindow deregisters the window at p (collective, like
// RegisterWindow). Close deregisters the windows left; Abort leaves them
// to ncclCommAbort.
func (c *Communicator) DeregisterWindow(ctx context.Context, p cuda.DevicePtr) error {
	reg, err := c.registry("DeregisterWindow")
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return classify(err)
	}
	return classify(reg.remove(p, true))
}

// allocWindow registers a buffer of Alloc as an NCCL window with
// Config.NCCLWindows, when NCCL is open and has windows (collective, like
// Alloc: every rank decides alike, from the same Config, the agreed NCCL
// set-up and the library version). A failure is returned; the buffer
// stays allocated until Close.
func (c *Communicator) allocWindow(ctx context.Context, p cuda.DevicePtr, bytes int) error {
	if !c.cfg.NCCLWindows || c.reg == nil || c.reg.r.noWindows() != "" {
		return nil
	}
	if err := c.reg.addWindow(ctx, p, int64(bytes)); err != nil {
		return classify(fmt.Errorf("comm: rank %d: Alloc: the buffer was allocated, but its NCCL window registration failed: %w", c.cfg.Rank, err))
	}
	return nil
}

// registry returns the communicator's registry, or why there is none.
func (c *Communicator) registry(op string) (*registry, error) {
	if err := c.gone(op); err != nil {
		return nil, err
	}
	switch {
	case c.gpu == nil:
		return nil, errorf(ErrInvalidArgument, "comm: rank %d: %s is for GPU communicators (NCCL registration)", c.cfg.Rank, op)
	case c.reg == nil:
		return nil, errorf(ErrUnsupported, "comm: rank %d: %s needs NCCL, and %v", c.cfg.Rank, op, c.gpu.ncclWhy())
	}
	return c.reg, nil
}
