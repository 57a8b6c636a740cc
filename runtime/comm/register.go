package comm

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/collgen/collgen/runtime/alloc"
	"github.com/collgen/collgen/runtime/cuda"
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
	// (NCCL_WIN_COLL_SYMMETRIC) and ncclCommWindowDeregister: collective,
	// every rank in the same order.
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
// (detach runs outside it).
type registry struct {
	r    registrar
	rank int

	mu     sync.Mutex
	regs   map[cuda.DevicePtr]*registration
	gone   map[cuda.DevicePtr]bool // deregistered bases, for the error message
	hookEr []error                 // failures inside the allocator's hook
	closed bool
	seq    int    // registrations made so far
	detach func() // unsubscribes from the allocator
}

// maxGone bounds the memory of deregistered bases kept for messages.
const maxGone = 4096

func newRegistry(r registrar, rank int) *registry {
	return &registry{r: r, rank: rank, regs: map[cuda.DevicePtr]*registration{}, gone: map[cuda.DevicePtr]bool{}}
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
	kind := "buffer"
	if window {
		kind = "window"
	}
	if p == 0 || bytes <= 0 || p+cuda.DevicePtr(bytes) < p {
		return errorf(ErrInvalidArgument, "comm: rank %d: register %s %#x of %d bytes: need a device address and a positive size that ends inside the address space", g.rank, kind, uintptr(p), bytes)
	}
	if reg := g.regs[p]; reg != nil && reg.bytes == bytes && reg.window == window {
		reg.refs++
		reg.segment = reg.segment || segment
		return nil
	}
	end := p + cuda.DevicePtr(bytes)
	for _, reg := range g.regs {
		if reg.base < end && reg.end() > p {
			what := "a registered buffer"
			switch {
			case reg.window:
				what = "a registered window"
			case reg.segment:
				what = "an allocator segment registered by the hook (its blocks need no registration of their own)"
			}
			return errorf(ErrInvalidArgument, "comm: rank %d: register %s [%#x, %#x): overlaps %s [%#x, %#x); register whole allocations, once each (a repeat of the same range is counted)",
				g.rank, kind, uintptr(p), uintptr(end), what, uintptr(reg.base), uintptr(reg.end()))
		}
	}
	if err := g.r.checkMemory(p, bytes); err != nil {
		return err
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
		out = append(out, *reg)
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
// ctx is accepted for symmetry with the other collective set-up calls.
// With Config.NCCLNonBlocking the wait is bounded by Config.Timeout; a
// blocking NCCL communicator (the default) waits in
// ncclCommWindowRegister for every rank without bound, and Abort waits
// for it.
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
	return classify(reg.add(p, bytes, true))
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
	if err := c.reg.add(p, int64(bytes), true); err != nil {
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
