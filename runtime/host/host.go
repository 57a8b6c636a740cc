// Package host is collgen's CPU backend: it executes the same schedules as
// the generated GPU kernels (schedule.Build), with ranks that are processes
// of one host sharing POSIX shared memory, or goroutines of one process
// sharing ordinary memory. Reduce loops come from a kernels.Library (the
// generated package's HostReducers); selection rules come from its host_shm
// topology.
//
// A Group is one communicator. Its collectives may be issued concurrently
// from several goroutines; each carries a tag (explicit, or the next value
// of an internal sequence) that picks a slot of shared memory and is
// checked at every barrier, so the data of two collectives never mixes.
// See docs/host-backend.md for the design, the segment lifecycle and the
// failure behaviour.
package host

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/shm"
	"github.com/collgen/collgen/schedule"
)

// Errors wrapped by the errors collectives return.
var (
	// ErrTimeout: a peer did not reach a barrier (or set-up step) before
	// the deadline.
	ErrTimeout = errors.New("host: timeout")
	// ErrPeerFailed: a peer died, abandoned the collective or closed the
	// group while others waited for it.
	ErrPeerFailed = errors.New("host: peer failed")
	// ErrMismatch: peers ran different collectives (tag, kind, dtype or
	// count) on the same slot at the same time.
	ErrMismatch = errors.New("host: collective mismatch")
	// ErrBroken: an earlier collective failed, leaving the group's shared
	// state inconsistent; make a new group.
	ErrBroken = errors.New("host: group broken by an earlier failure")
	// ErrClosed: the group was closed.
	ErrClosed = errors.New("host: group closed")
	// ErrInvalidArgument: a call's arguments cannot describe a collective
	// (unknown dtype or op, negative or overflowing count, buffers too
	// small or misaligned, input and output overlapping other than in
	// place, an algorithm the host cannot run), or New's
	// Config cannot describe a group (world size, rank, store, group name,
	// slots, lanes or slot size out of range).
	ErrInvalidArgument = errors.New("host: invalid argument")
	// ErrSharedMemory: this rank's segment could not be made (a full or
	// missing /dev/shm, its name taken by another file, out of
	// descriptors, or a layout larger than the memory the process has
	// left).
	ErrSharedMemory = errors.New("host: shared memory")
)

// DefaultTimeout bounds every wait when neither Config.Timeout nor the
// context says otherwise.
const DefaultTimeout = 60 * time.Second

// Config describes one rank's membership of a group.
type Config struct {
	// Rank and WorldSize: this rank's index and the group size (1..64).
	Rank, WorldSize int
	// Store is the rendezvous store the ranks share; keys are prefixed
	// with "collgen/host/<Group>/".
	Store rendezvous.Store
	// Group names the group; every rank passes the same name, and groups
	// sharing a Store need distinct names. Segment names add a random
	// nonce agreed through the store, so groups never collide in /dev/shm
	// even with equal names on different stores.
	Group string
	// Library supplies host reduce loops and host_shm selection rules;
	// nil uses PortableLibrary().
	Library *kernels.Library
	// Shared selects POSIX shared memory (ranks are processes); false
	// means ranks are goroutines of this process sharing ordinary memory.
	Shared bool
	// Provider overrides the segment provider chosen by Shared (tests).
	Provider shm.Provider
	// Timeout bounds each wait (a barrier, a set-up step, a busy slot)
	// when the context has no earlier deadline; 0 means DefaultTimeout.
	Timeout time.Duration
	// SlotBytes is the shared memory per slot per rank; messages larger
	// than a slot are processed in pieces. 0 picks clamp(32 MiB / WorldSize,
	// 256 KiB, 8 MiB). Rank 0's value wins when others pass 0.
	SlotBytes int
	// Slots is how many collectives with explicit tags may be in flight at
	// once without waiting for each other (tag t uses slot t mod Slots;
	// sequence-tag collectives all use slot 0); 0 means 4.
	Slots int
	// Lanes is how many threads of a rank split a large message (each lane
	// with its own part of the slot and its own barrier flags): the
	// calling goroutine and Lanes-1 helper goroutines, which the group
	// starts with its shared memory and Close ends; 0 means
	// clamp(3/4 of min(NumCPU, GOMAXPROCS) / WorldSize, 1, 8).
	Lanes int
}

// Options tune one collective call.
type Options struct {
	// Algorithm forces a schedule (coll.OneShot, coll.TwoShot); coll.Auto
	// picks one by message size with the Library's host_shm rules.
	Algorithm coll.Algorithm
	// Tag identifies the collective across ranks: the same call on every
	// rank must carry the same tag, and collectives in flight at once need
	// distinct tags. 0 takes the next value of the group's sequence, which
	// matches across ranks when every rank issues its calls in the same
	// order; such collectives run one at a time, on slot 0. Do not mix
	// explicit and sequence tags in one group.
	Tag uint64
}

// Group is one rank's handle on a host communicator. It is safe for
// concurrent use.
type Group struct {
	cfg      Config
	lib      *kernels.Library
	prov     shm.Provider
	goPark   bool   // prov is shm.InProcess: blocked waits park in the Go scheduler (ordinary memory), not on a futex
	cpus     int    // usableCPUs() when the group was made
	prefix   string // store key prefix
	timeout  time.Duration
	seq      atomic.Uint64 // last sequence tag handed out
	slotLock []chan struct{}
	// execs[slot] is the state of the collective holding slot's lock, and
	// srcs[slot*Lanes+lane] its lane's source list: reused, so that a call
	// allocates nothing (set up with the slots).
	execs []exec
	srcs  [][][]byte
	// laneMem[slot*Lanes+lane] is what this rank knows about the lane's
	// area between collectives (see lane).
	laneMem []laneMem
	// claims[slot] hands out the lanes of the collective holding slot's
	// lock; help runs lanes beside the callers (lanes.go).
	claims []claims
	help   helpers

	// setupSem (capacity 1) serialises lazy set-up and Close's teardown;
	// held only while setting up or tearing down. A channel, not a
	// mutex, so a call waiting for another call's set-up stops waiting
	// when its own context ends.
	setupSem chan struct{}
	ready    atomic.Bool
	// cancelSetup (under cancelMu) ends the set-up in progress, for
	// Close; nil when none runs.
	cancelMu    sync.Mutex
	cancelSetup context.CancelCauseFunc
	lay         layout
	self        shm.Segment   // our segment, read-write
	peers       []shm.Segment // by rank; peers[rank] == self
	mems        [][]byte      // peers[i].Bytes(), cached
	names       []string      // segment names by rank
	pidNS       uint64

	schedMu sync.Mutex
	scheds  map[schedKey]*prepared

	waits [3]atomic.Uint64 // slow waits by the phase that ended them (WaitStats)

	broken atomic.Pointer[error] // first fatal error, if any
	// closeMu orders begin's registration of a call against Close: a
	// call is added to active (read-locked) only while closed is unset,
	// and Close sets closed (write-locked) before waiting for active, so
	// no Add from zero can race that Wait.
	closeMu sync.RWMutex
	closed  atomic.Bool
	active  sync.WaitGroup // collectives in flight, for Close
}

type schedKey struct {
	collective coll.Collective
	algorithm  coll.Algorithm
}

// New checks cfg and returns a Group. Shared memory is set up lazily by the
// first collective (or by Setup), exactly once even when many goroutines
// arrive together.
func New(ctx context.Context, cfg Config) (*Group, error) {
	if cfg.WorldSize < 1 || cfg.WorldSize > 64 {
		return nil, invalidConfigf("host: world size %d out of range 1..64", cfg.WorldSize)
	}
	if cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize {
		return nil, invalidConfigf("host: rank %d out of range 0..%d", cfg.Rank, cfg.WorldSize-1)
	}
	if cfg.Store == nil {
		return nil, invalidConfigf("host: Config.Store is nil; ranks need a rendezvous store to agree on segment names")
	}
	if cfg.Group == "" {
		return nil, invalidConfigf("host: Config.Group is empty; name the group (unique per store)")
	}
	switch {
	case cfg.Slots < 0 || cfg.Slots > 64:
		return nil, invalidConfigf("host: Config.Slots %d: want 1..64, or 0 for the default", cfg.Slots)
	case cfg.Lanes < 0 || cfg.Lanes > MaxLanes:
		return nil, invalidConfigf("host: Config.Lanes %d: want 1..%d, or 0 for the default", cfg.Lanes, MaxLanes)
	case cfg.SlotBytes < 0 || cfg.SlotBytes > MaxSlotBytes:
		return nil, invalidConfigf("host: Config.SlotBytes %d: want a positive size up to %d, or 0 for the default", cfg.SlotBytes, MaxSlotBytes)
	}
	g := &Group{cfg: cfg, lib: cfg.Library, prov: cfg.Provider, timeout: cfg.Timeout, cpus: usableCPUs(),
		prefix: keyPrefix(cfg.Group), scheds: map[schedKey]*prepared{}, setupSem: make(chan struct{}, 1)}
	if g.lib == nil {
		g.lib = PortableLibrary()
	}
	if g.prov == nil {
		if cfg.Shared {
			g.prov = shm.Posix{}
		} else {
			g.prov = shm.InProcess{}
		}
	}
	_, g.goPark = g.prov.(shm.InProcess)
	if g.timeout <= 0 {
		g.timeout = DefaultTimeout
	}
	return g, nil
}

// configError is a Config that New refuses: its text is the message alone
// (it names the field), and errors.Is matches ErrInvalidArgument.
type configError struct{ msg string }

// Error is the message, which names the field and what to pass instead.
func (e *configError) Error() string { return e.msg }

// Unwrap makes errors.Is(err, ErrInvalidArgument) true.
func (e *configError) Unwrap() error { return ErrInvalidArgument }

// invalidConfigf formats a configError.
func invalidConfigf(format string, args ...any) error {
	return &configError{msg: fmt.Sprintf(format, args...)}
}

// MaxSlotBytes bounds Config.SlotBytes: a segment holds Slots slots of
// every rank's stage and scratch, so a larger slot would overflow its
// size (a message larger than a slot runs through it in pieces anyway).
const MaxSlotBytes = 1 << 36

// Rank returns this rank's index.
func (g *Group) Rank() int { return g.cfg.Rank }

// WorldSize returns the group size.
func (g *Group) WorldSize() int { return g.cfg.WorldSize }

// defaultLayout resolves the zero fields of the config.
func (g *Group) defaultLayout() layout {
	w := g.cfg.WorldSize
	l := layout{Slots: g.cfg.Slots, Lanes: g.cfg.Lanes}
	if l.Slots == 0 {
		l.Slots = 4
	}
	if l.Lanes == 0 {
		// Three quarters of the CPUs: with every CPU running a lane, the
		// runtime's own threads and anything else on the host preempt
		// lanes that peers wait for (32-core GPU host, 16 MiB all-reduce:
		// world 4 on 6 lanes 1.25-1.28 ms against 1.59-1.71 on 8; world 8
		// on 3 lanes 2.85-2.96 ms against 3.37-3.68 on 4).
		l.Lanes = min(max(g.cpus*3/4/w, 1), 8)
	}
	sb := g.cfg.SlotBytes
	if sb == 0 {
		sb = min(max(32<<20/w, 256<<10), 8<<20)
	}
	lane := laneBytes(sb, l.Lanes, w)
	l.LaneBytes = lane
	return l
}

// laneBytes splits a slot of sb bytes into lanes, page aligned, and at
// least big enough for one 64-byte vector per rank in Stage and Scratch.
func laneBytes(sb, lanes, world int) int {
	return max(sb/lanes/pageBytes*pageBytes, roundUp(2*world*64, pageBytes))
}

// waitCtx returns the context for one wait: ctx bounded by the group's
// timeout.
func (g *Group) waitCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, g.timeout)
}

// fail records the first fatal error and tells peers, through our abort
// word, to stop waiting for us.
func (g *Group) fail(err error) {
	if g.broken.CompareAndSwap(nil, &err) && g.self != nil {
		// Single writer (us); peers' wait loops load it with
		// atomic.LoadUint64 and give up on seeing nonzero.
		atomic.StoreUint64(hdr(g.self.Bytes(), hdrAbort), 1)
	}
}

func (g *Group) brokenErr() error {
	if p := g.broken.Load(); p != nil {
		return fmt.Errorf("%w: %w", ErrBroken, *p)
	}
	return nil
}

// Close tells peers this rank has left (so a peer still waiting for it
// fails fast), ends a set-up in progress at once (its call returns
// ErrClosed), waits for this rank's collectives in flight, unmaps every
// segment and, if set-up never finished, unlinks whatever names it created.
// A rank that closes before its set-up finished says so through the store,
// so peers waiting in theirs fail with ErrPeerFailed naming it instead of
// timing out. Close is idempotent.
func (g *Group) Close() error {
	g.closeMu.Lock()
	closing := g.closed.CompareAndSwap(false, true)
	g.closeMu.Unlock()
	if !closing {
		return nil
	}
	g.cancelMu.Lock()
	if g.cancelSetup != nil {
		g.cancelSetup(ErrClosed)
	}
	g.cancelMu.Unlock()
	if !g.ready.Load() && g.broken.Load() == nil { // a set-up that failed decided already
		g.markLeft()
	}
	g.active.Wait()
	g.setupSem <- struct{}{}
	defer func() { <-g.setupSem }()
	if g.self == nil {
		return nil
	}
	// Single writer (us); read by peers' wait loops after their counter
	// load, so a peer that sees closed and re-reads our counter sees
	// every arrival we made before closing.
	atomic.StoreUint64(hdr(g.self.Bytes(), hdrClosed), 1)
	var first error
	for i, s := range g.peers {
		if s == nil {
			continue
		}
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
		g.peers[i] = nil
	}
	g.self, g.mems = nil, nil
	g.stopHelpers()
	return first
}

// begin registers a collective in flight and returns its error if the
// group cannot run one.
func (g *Group) begin() error {
	g.closeMu.RLock()
	if g.closed.Load() {
		g.closeMu.RUnlock()
		return ErrClosed
	}
	g.active.Add(1)
	g.closeMu.RUnlock()
	if err := g.brokenErr(); err != nil {
		g.active.Done()
		return err
	}
	return nil
}

// CanRun returns nil if the group can run collective with algorithm (its
// schedule builds at this world size and the host can execute it), else
// the error a call would return, wrapping ErrInvalidArgument where the
// algorithm is refused; the schedule is cached for the calls.
func (g *Group) CanRun(collective coll.Collective, algorithm coll.Algorithm) error {
	_, err := g.schedule(collective, algorithm)
	return err
}

// schedule returns the cached schedule of a collective and algorithm,
// resolved for this rank (prepare).
func (g *Group) schedule(collective coll.Collective, algorithm coll.Algorithm) (*prepared, error) {
	g.schedMu.Lock()
	defer g.schedMu.Unlock()
	k := schedKey{collective, algorithm}
	if s, ok := g.scheds[k]; ok {
		return s, nil
	}
	s, err := schedule.Build(collective, algorithm, g.cfg.WorldSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err) // ErrInvalidArgument says "host: "
	}
	if err := schedule.HostCanRun(s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	for _, ph := range s.Phases {
		for _, st := range ph.Steps {
			if !st.Dst.Rank.IsSelf() {
				return nil, fmt.Errorf("host: %s writes a peer's %s; the host backend maps peers read-only", s.Name(), st.Dst.Buf)
			}
			if st.Dst.Buf == schedule.Input {
				return nil, fmt.Errorf("host: %s writes its input", s.Name())
			}
		}
	}
	if n := len(s.Phases); n == 0 || !s.Phases[n-1].Sync || s.Barriers() < 2 {
		return nil, fmt.Errorf("host: %s must end in a barrier and have at least two", s.Name())
	}
	ps := prepare(s, g.cfg.Rank)
	g.scheds[k] = ps
	return ps, nil
}

// Algorithm returns the algorithm the Library's host_shm rules pick for a
// collective of the given total byte size (kernels.Selection.Choose, the
// one selection function of the runtime), or an error wrapping
// ErrInvalidArgument when the rules have no host algorithm for it.
func (g *Group) Algorithm(collective coll.Collective, bytes int64) (coll.Algorithm, error) {
	sel, ok := g.lib.Selection(coll.HostSHM, collective, g.cfg.WorldSize)
	if !ok {
		return "", fmt.Errorf("%w: library %q has no host_shm rules for %s at world size %d; add them to the spec's host topology",
			ErrInvalidArgument, g.lib.Package, collective, g.cfg.WorldSize)
	}
	a := sel.Choose(bytes, false) // host buffers are never symmetric device memory
	if !a.Generated() {
		return "", fmt.Errorf("%w: the host_shm rules select %s for %s of %d bytes; the host backend runs generated schedules only",
			ErrInvalidArgument, a, collective, bytes)
	}
	return a, nil
}

// AllReduce reduces count elements of dtype across all ranks with op (sum,
// max, min): out = op over every rank's in. in and out hold count elements
// each and may be the same slice (in place).
func (g *Group) AllReduce(ctx context.Context, in, out []byte, count int, dtype coll.DType, op coll.Op, opts Options) error {
	return g.run(ctx, call{collective: coll.AllReduce, in: in, out: out, count: count, dtype: dtype, op: op, opts: opts})
}

// ReduceScatter reduces WorldSize*recvCount elements across ranks and leaves
// block Rank of the result in out: in holds WorldSize*recvCount elements, out
// recvCount. In place is out = in[Rank*recvCount*size:].
func (g *Group) ReduceScatter(ctx context.Context, in, out []byte, recvCount int, dtype coll.DType, op coll.Op, opts Options) error {
	return g.run(ctx, call{collective: coll.ReduceScatter, in: in, out: out, count: recvCount, dtype: dtype, op: op, opts: opts})
}

// AllGather concatenates every rank's sendCount elements in rank order into
// out (WorldSize*sendCount elements). In place is in = out[Rank*sendCount*size:].
func (g *Group) AllGather(ctx context.Context, in, out []byte, sendCount int, dtype coll.DType, opts Options) error {
	return g.run(ctx, call{collective: coll.AllGather, in: in, out: out, count: sendCount, dtype: dtype, opts: opts})
}

// Setup creates and maps the shared segments now instead of on the first
// collective. Every rank must call it (or a collective).
func (g *Group) Setup(ctx context.Context) error {
	if err := g.begin(); err != nil {
		return err
	}
	defer g.active.Done()
	return g.ensureSetup(ctx)
}

// PortableLibrary returns a Library with the portable reduce loops of
// package numeric for every host dtype and op, and the shipped spec's
// host_shm selection rules (all-reduce: one-shot up to 2 KiB at worlds
// 1-4, two-shot above and at every larger world; one-shot reduce-scatter
// and all-gather; a test keeps them equal to the generated library's). It
// stands in for the generated library in tests and in tools built without
// generated code.
func PortableLibrary() *kernels.Library {
	lib := &kernels.Library{Package: "portable", HostReducers: map[kernels.HostKey]kernels.HostReduceFunc{}}
	for _, dt := range numeric.DTypes {
		for _, op := range coll.Ops() {
			f, err := numeric.Reducer(dt, op)
			if err != nil {
				panic(err)
			}
			lib.HostReducers[kernels.HostKey{DType: dt, Op: op}] = f
		}
	}
	worlds := func(lo, hi int) []int {
		ws := make([]int, 0, hi-lo+1)
		for w := lo; w <= hi; w++ {
			ws = append(ws, w)
		}
		return ws
	}
	sel := func(c coll.Collective, ws []int, rules ...kernels.Rule) kernels.Selection {
		return kernels.Selection{Topology: "host", Kind: coll.HostSHM, Collective: c, Worlds: ws, Rules: rules}
	}
	lib.Selections = []kernels.Selection{
		sel(coll.AllReduce, worlds(1, 4), kernels.Rule{UpTo: 2 << 10, Use: coll.OneShot}, kernels.Rule{Use: coll.TwoShot}),
		sel(coll.AllReduce, worlds(5, 64), kernels.Rule{Use: coll.TwoShot}),
		sel(coll.ReduceScatter, worlds(1, 64), kernels.Rule{Use: coll.OneShot}),
		sel(coll.AllGather, worlds(1, 64), kernels.Rule{Use: coll.OneShot}),
	}
	return lib
}
