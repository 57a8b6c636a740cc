package gpubench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/nccl"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// Config describes one sweep. Every rank must use the same Config.
type Config struct {
	// Library is the generated kernel library (collectives.Library).
	Library *kernels.Library
	// WorldSize is the number of ranks (GPUs).
	WorldSize int
	// Devices are the CUDA ordinals of ranks 0..WorldSize-1; nil means 0..WorldSize-1.
	Devices []int
	// Collective is the collective to measure.
	Collective coll.Collective
	// DType and Op select the kernels (Op is ignored for all-gather).
	DType coll.DType
	Op    coll.Op
	// Sizes are the message sizes in bytes (full buffer; see Shape).
	Sizes []int64
	// Algorithms are the variant names (see Variants); nil means all.
	Algorithms []string
	// Group names the sweep's communicators and store keys (default
	// "bench"); sweeps sharing a store one after another need distinct ones.
	Group string
	// Topology is passed to comm.Config.Topology ("" lets comm choose).
	Topology string
	// Eager times collectives launched one by one instead of graph replays.
	Eager bool
	// Check verifies every variant's result once per size before timing it.
	Check bool
	// Awkward adds after every size its awkward twin of this kind
	// (bench.Awkward; bench.AwkwardBoth: one element less, input and output
	// pointers one element off alignment); AwkwardNone, none.
	Awkward bench.AwkwardKind
	// ZeroCopy puts the inputs in symmetric buffers (Communicator.Alloc), so
	// generated kernels read them in place instead of copying them into the
	// staging buffer first.
	ZeroCopy bool
	// OpsPerGraph is K, the collectives per replay (default 20).
	OpsPerGraph int
	// Warmup is the eager collectives before capture (default 5).
	Warmup int
	// Replays fixes the number of timed replays; 0 adapts it to TargetMS,
	// within [MinReplays, MaxReplays] (defaults 20 ms, 5, 1000).
	Replays                int
	TargetMS               float64
	MinReplays, MaxReplays int
	// StagingBytes overrides the staging size (default StagingFor's).
	StagingBytes int64
	// Timeout bounds each in-kernel wait (comm.Config.Timeout).
	Timeout time.Duration
	// FatbinPath loads kernels from a prebuilt fatbin (comm.Config.FatbinPath).
	FatbinPath string
	// NoEarlyLaunch launches kernels without programmatic dependent launch
	// (comm.Config.NoEarlyLaunch).
	NoEarlyLaunch bool
	// MaxBlocks caps every kernel launch's blocks (comm.Config.MaxBlocks).
	MaxBlocks int
	// NCCLNonBlocking opens NCCL non-blocking (comm.Config.NCCLNonBlocking).
	NCCLNonBlocking bool
	// Progress, when set, is called on rank 0 after each measurement with
	// the number done, the total, and the measurement.
	Progress func(done, total int, m *Measurement)
	// Log receives notes (skips, the staging size); nil discards them.
	Log io.Writer
}

func (c *Config) withDefaults() Config {
	o := *c
	if o.OpsPerGraph <= 0 {
		o.OpsPerGraph = DefaultOpsPerGraph
	}
	if o.Warmup <= 0 {
		o.Warmup = DefaultWarmup
	}
	if o.TargetMS <= 0 {
		o.TargetMS = DefaultTargetMS
	}
	if o.MinReplays <= 0 {
		o.MinReplays = DefaultMinReplays
	}
	if o.MaxReplays <= 0 {
		o.MaxReplays = DefaultMaxReplays
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Group == "" {
		o.Group = "bench"
	}
	if o.Collective == coll.AllGather {
		o.Op = ""
	}
	return o
}

// validate checks what can be checked without a GPU.
func (c *Config) validate() ([]Variant, error) {
	switch {
	case c.Library == nil:
		return nil, errors.New("gpubench: Config.Library is nil; pass the generated collectives.Library")
	case c.WorldSize < 1:
		return nil, fmt.Errorf("gpubench: world size %d must be at least 1", c.WorldSize)
	case c.Devices != nil && len(c.Devices) != c.WorldSize:
		return nil, fmt.Errorf("gpubench: %d devices for world size %d; give one per rank", len(c.Devices), c.WorldSize)
	case len(c.Sizes) == 0:
		return nil, errors.New("gpubench: no sizes to measure")
	case !c.DType.Valid():
		return nil, fmt.Errorf("gpubench: unknown dtype %q", c.DType)
	}
	switch c.Collective {
	case coll.AllReduce, coll.ReduceScatter:
		if err := numeric.CheckOp(c.Op); err != nil {
			return nil, fmt.Errorf("gpubench: %w", err)
		}
		if c.DType.IsFloat8() {
			return nil, fmt.Errorf("gpubench: %s cannot reduce %s (a copy-only type); use it with allgather", c.Collective, c.DType)
		}
	case coll.AllGather:
	default:
		return nil, fmt.Errorf("gpubench: unknown collective %q (want %s, %s or %s)", c.Collective, coll.AllReduce, coll.ReduceScatter, coll.AllGather)
	}
	vs, missing, err := Variants(c.Library, c.Collective, c.DType, c.Op, c.WorldSize, c.Algorithms)
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		fmt.Fprintf(c.Log, "note: %s %s %s at world %d has no %s kernel; left out of its sweep\n", c.Collective, c.DType, opOrDash(c.Collective, c.Op), c.WorldSize, strings.Join(missing, " or "))
	}
	return vs, nil
}

// Plan is the sweep's agreed set-up, the same on every rank.
type Plan struct {
	Variants []Variant // the columns: what is measured at every size
	Staging  int64     // comm.Config.StagingBytes for the sweep's communicators: Config.StagingBytes, else StagingFor's (0: comm's default)
	Shapes   []Shape   // one per usable size, in order
}

// NewPlan validates cfg and works out variants, staging and shapes.
func NewPlan(cfg Config) (*Plan, error) {
	c := cfg.withDefaults()
	vs, err := c.validate()
	if err != nil {
		return nil, err
	}
	p := &Plan{Variants: vs}
	var last int64 // the previous aligned shape's bytes
	for _, b := range c.Sizes {
		sh, ok := ShapeFor(c.Collective, c.DType, b, c.WorldSize)
		if !ok {
			fmt.Fprintf(c.Log, "note: %s is less than one %s element per rank at world %d; skipped\n", FormatSize(b), c.DType, c.WorldSize)
			continue
		}
		if sh.Bytes == last {
			continue
		}
		last = sh.Bytes
		p.Shapes = append(p.Shapes, sh)
		if aw, ok := bench.Awkward(c.Collective, c.DType, sh, c.WorldSize, c.Awkward); ok {
			p.Shapes = append(p.Shapes, aw)
		}
	}
	if len(p.Shapes) == 0 {
		return nil, errors.New("gpubench: no size holds one element per rank; use larger sizes")
	}
	sizes := make([]int64, len(p.Shapes))
	for i, sh := range p.Shapes {
		sizes[i] = sh.Bytes
	}
	p.Staging = c.StagingBytes
	if p.Staging <= 0 {
		p.Staging = StagingFor(c.Library, c.Collective, c.WorldSize, sizes, vs, 0)
	}
	return p, nil
}

// Run measures the sweep with one goroutine per GPU in this process and
// returns the measurements in (size, variant) order. Measurements that fail
// are recorded with Error and the sweep goes on, unless a communicator
// broke (a kernel timed out), which ends the sweep with an error next to
// the measurements made so far.
func Run(ctx context.Context, cfg Config) ([]Measurement, error) {
	if _, err := NewPlan(cfg); err != nil {
		return nil, err
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("gpubench: no usable CUDA driver (%w); the GPU bench needs NVIDIA GPUs", err)
	}
	if n == 0 {
		return nil, errors.New("gpubench: no CUDA GPU found; the GPU bench needs NVIDIA GPUs (--backend host benchmarks the CPU backend)")
	}
	devs := cfg.Devices
	if devs == nil {
		for r := 0; r < cfg.WorldSize; r++ {
			devs = append(devs, r)
		}
	}
	for _, d := range devs {
		if d >= n {
			return nil, fmt.Errorf("gpubench: world size %d needs GPU %d, but this machine has %d GPU(s); lower -n", cfg.WorldSize, d, n)
		}
	}
	cfg.Devices = devs
	store := rendezvous.NewMemStore()
	peers := LocalPeers(cfg.WorldSize)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		res  []Measurement
		errs = make([]error, cfg.WorldSize)
	)
	for r := 0; r < cfg.WorldSize; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			ms, err := runRank(ctx, cfg, r, store, peers[r])
			if err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				cancel() // unblock peers waiting in a host barrier
			}
			if r == 0 {
				res = ms
			}
		}(r)
	}
	wg.Wait()
	return res, errors.Join(errs...)
}

// RunRank runs one rank of a sweep whose ranks are processes sharing
// store; rank 0 returns the measurements, the others return nil.
// cfg.Devices[rank] (default rank) is this process's GPU.
func RunRank(ctx context.Context, cfg Config, rank int, store rendezvous.Store) ([]Measurement, error) {
	if rank < 0 || rank >= cfg.WorldSize {
		return nil, fmt.Errorf("gpubench: rank %d of world size %d: want 0 <= rank < world size", rank, cfg.WorldSize)
	}
	c := cfg.withDefaults()
	return runRank(ctx, cfg, rank, store, StorePeers(store, "collgen/bench/"+c.Group+"/peers", rank, cfg.WorldSize))
}

// rankState is one rank's resources.
type rankState struct {
	cfg    Config
	plan   *Plan
	rank   int
	c      *comm.Communicator
	dev    *cuda.Device
	s      *cuda.Stream
	peers  Peers
	bufs   map[Buffers]*bufSet // by kind; PlainBuffers always
	bufErr map[Buffers]error   // why a kind's buffers could not be set up (agreed)
	host   []byte              // output copy-back for --check
	events []*cuda.Event
	owned  []cuda.DevicePtr // plain allocations to free
	// ncclOwned are ncclMemAlloc allocations to free, windows those
	// registered as windows (deregistered first, in order on every rank).
	ncclOwned []cuda.DevicePtr
	windows   []cuda.DevicePtr
	// registeredBufs are registered with NCCL (deregistered before freed).
	registeredBufs []cuda.DevicePtr
	warmed         bool // the clock warm-up has run
}

func runRank(ctx context.Context, cfg Config, rank int, store rendezvous.Store, peers Peers) (ms []Measurement, err error) {
	plan, err := NewPlan(cfg)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if rank != 0 {
		cfg.Log = io.Discard
	}
	dev := rank
	if cfg.Devices != nil {
		dev = cfg.Devices[rank]
	}
	if rank == 0 {
		if plan.Staging > 0 {
			fmt.Fprintf(cfg.Log, "staging buffer: %s per area (forced generated algorithms above it are skipped)\n", FormatSize(plan.Staging))
		} else {
			fmt.Fprintf(cfg.Log, "staging buffer: comm's default (within %s per rank)\n", FormatSize(comm.DefaultStagingBudget))
		}
	}
	c, err := comm.New(ctx, comm.Config{Rank: rank, WorldSize: cfg.WorldSize, Device: dev, Store: store,
		Library: cfg.Library, Group: cfg.Group, Topology: cfg.Topology, Timeout: cfg.Timeout,
		StagingBytes: plan.Staging, FatbinPath: cfg.FatbinPath, NoEarlyLaunch: cfg.NoEarlyLaunch, MaxBlocks: cfg.MaxBlocks,
		NCCLNonBlocking: cfg.NCCLNonBlocking})
	if err != nil {
		return nil, err
	}
	st := &rankState{cfg: cfg, plan: plan, rank: rank, c: c, dev: c.Device(), peers: peers}
	defer func() {
		err = errors.Join(err, st.release())
	}()
	if err := agree(ctx, peers, st.setup(ctx)); err != nil {
		return nil, fmt.Errorf("set-up: %w", err)
	}
	return st.sweep(ctx)
}

// bufSet is one kind's inputs (alternating) and output. Awkward shapes
// (Shape.Offset) read inputs of their own, filled from off bytes into
// their allocations, and write the output from off bytes in; every awkward
// shape of a sweep has the same offset (one element of its dtype).
type bufSet struct {
	in    [2]cuda.DevicePtr
	inOff [2]cuda.DevicePtr // allocation starts; the inputs are off bytes in
	out   cuda.DevicePtr    // maxOut + off bytes
	off   int64
}

// at returns the input (number i: inputs alternate) and the output of a
// call of shape sh.
func (b *bufSet) at(sh Shape, i int) (in, out cuda.DevicePtr) {
	if sh.Offset > 0 {
		return b.inOff[i%2] + cuda.DevicePtr(b.off), b.out + cuda.DevicePtr(b.off)
	}
	return b.in[i%2], b.out
}

// setup allocates the inputs (largest size, filled once: every size reads
// a prefix) and the output, and the stream; then a set of its own for each
// kind of registered buffers a variant names (see setupRegistered).
func (st *rankState) setup(ctx context.Context) error {
	var err error
	if st.s, err = st.dev.NewStream(); err != nil {
		return err
	}
	var maxIn, maxOut, off int64
	for _, sh := range st.plan.Shapes {
		maxIn, maxOut, off = max(maxIn, sh.InBytes), max(maxOut, sh.OutBytes), max(off, sh.Offset)
	}
	alloc := st.alloc
	if st.cfg.ZeroCopy {
		alloc = func(n int) (cuda.DevicePtr, error) { return st.c.Alloc(ctx, n) }
	}
	plain, err := st.fill(maxIn, maxOut, off, alloc, st.alloc)
	if err != nil {
		return err
	}
	st.bufs = map[Buffers]*bufSet{PlainBuffers: plain}
	st.bufErr = map[Buffers]error{}
	if st.cfg.Check {
		st.host = make([]byte, maxOut)
	}
	return st.setupRegistered(ctx, maxIn, maxOut, off)
}

// fill allocates a set with inAlloc and outAlloc and writes the inputs
// (with off > 0 also the awkward shapes' inputs).
func (st *rankState) fill(maxIn, maxOut, off int64, inAlloc, outAlloc func(int) (cuda.DevicePtr, error)) (*bufSet, error) {
	b := &bufSet{off: off}
	host := make([]byte, maxIn)
	var err error
	for i, seed := range []int{seed0, seed1} {
		if b.in[i], err = inAlloc(int(maxIn)); err != nil {
			return nil, fmt.Errorf("input buffer of %s: %w", FormatSize(maxIn), err)
		}
		FillInput(st.cfg.DType, host, seed, st.rank)
		if err := st.dev.CopyHtoD(b.in[i], host); err != nil {
			return nil, err
		}
		if off == 0 {
			continue
		}
		if b.inOff[i], err = inAlloc(int(maxIn + off)); err != nil {
			return nil, fmt.Errorf("input buffer of %s: %w", FormatSize(maxIn+off), err)
		}
		if err := st.dev.CopyHtoD(b.inOff[i]+cuda.DevicePtr(off), host); err != nil {
			return nil, err
		}
	}
	if b.out, err = outAlloc(int(maxOut + off)); err != nil {
		return nil, fmt.Errorf("output buffer of %s: %w", FormatSize(maxOut+off), err)
	}
	return b, nil
}

// allocation is one allocation of a set and its size.
type allocation struct {
	p cuda.DevicePtr
	n int64
}

// allocations lists a set's allocations (as fill made them).
func (b *bufSet) allocations(maxIn, maxOut int64) []allocation {
	as := []allocation{{b.in[0], maxIn}, {b.in[1], maxIn}, {b.out, maxOut + b.off}}
	if b.off > 0 {
		as = append(as, allocation{b.inOff[0], maxIn + b.off}, allocation{b.inOff[1], maxIn + b.off})
	}
	return as
}

// setupRegistered makes the sets the NCCL variants on registered buffers
// need: cuMemAlloc buffers registered with NCCL (nccl_reg), and
// ncclMemAlloc buffers registered as symmetric windows (nccl_win). A kind
// that cannot be set up (NCCL not in use, NCCL before 2.27 for windows) is
// recorded, agreed across ranks, and its variant skipped with the reason.
func (st *rankState) setupRegistered(ctx context.Context, maxIn, maxOut, off int64) error {
	for _, kind := range []Buffers{RegisteredBuffers, WindowBuffers} {
		if !slices.ContainsFunc(st.plan.Variants, func(v Variant) bool { return v.Buffers == kind }) {
			continue
		}
		b, err := st.registered(ctx, kind, maxIn, maxOut, off)
		if err := agree(ctx, st.peers, err); err != nil {
			st.bufErr[kind] = err
			continue
		}
		st.bufs[kind] = b
	}
	return nil
}

// registered allocates and registers one set of the given kind: cuMemAlloc
// buffers registered with RegisterBuffer, or ncclMemAlloc buffers
// registered as windows (collective: every rank in the same order).
func (st *rankState) registered(ctx context.Context, kind Buffers, maxIn, maxOut, off int64) (*bufSet, error) {
	alloc := st.alloc
	register := func(p cuda.DevicePtr, n int64) error {
		err := st.c.RegisterBuffer(p, n)
		if err == nil {
			st.registeredBufs = append(st.registeredBufs, p)
		}
		return err
	}
	if kind == WindowBuffers {
		lib, err := nccl.Load()
		if err != nil {
			return nil, err
		}
		alloc = func(n int) (cuda.DevicePtr, error) {
			p, err := lib.MemAlloc(st.dev, n)
			if err == nil {
				st.ncclOwned = append(st.ncclOwned, p)
			}
			return p, err
		}
		register = func(p cuda.DevicePtr, n int64) error {
			err := st.c.RegisterWindow(ctx, p, n)
			if err == nil {
				st.windows = append(st.windows, p)
			}
			return err
		}
	}
	b, err := st.fill(maxIn, maxOut, off, alloc, alloc)
	if err != nil {
		return nil, err
	}
	for _, a := range b.allocations(maxIn, maxOut) {
		if err := register(a.p, a.n); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (st *rankState) alloc(n int) (cuda.DevicePtr, error) {
	p, err := st.dev.Alloc(n)
	if err == nil {
		st.owned = append(st.owned, p)
	}
	return p, err
}

func (st *rankState) release() error {
	var errs []error
	if st.s != nil {
		errs = append(errs, st.s.Synchronize())
	}
	for _, e := range st.events {
		errs = append(errs, e.Destroy())
	}
	// Registrations go before their memory.
	for _, p := range st.registeredBufs {
		errs = append(errs, st.c.DeregisterBuffer(p))
	}
	for _, p := range st.windows {
		errs = append(errs, st.c.DeregisterWindow(context.Background(), p))
	}
	if len(st.ncclOwned) > 0 {
		lib, err := nccl.Load()
		errs = append(errs, err)
		for _, p := range st.ncclOwned {
			if err == nil {
				errs = append(errs, lib.MemFree(st.dev, p))
			}
		}
	}
	for _, p := range st.owned {
		errs = append(errs, st.dev.Free(p))
	}
	if st.s != nil {
		errs = append(errs, st.s.Destroy())
	}
	// Last: Close may release the device's context.
	errs = append(errs, st.c.Close())
	return errors.Join(errs...)
}

// sweep measures every (size, variant).
func (st *rankState) sweep(ctx context.Context) ([]Measurement, error) {
	cfg := st.cfg
	// NCCL is available when the communicator would hand it an
	// impossibly large message (every rank gets the same answer).
	var ncclErr error
	if _, err := st.c.Choose(cfg.Collective, math.MaxInt64/2, cfg.DType, cfg.Op); err != nil {
		ncclErr = err
	}
	mode := "graph"
	if cfg.Eager {
		mode = "eager"
	}
	total := len(st.plan.Shapes) * len(st.plan.Variants)
	var out []Measurement
	for _, sh := range st.plan.Shapes {
		var group []Measurement
		for _, v := range st.plan.Variants {
			m := Measurement{Collective: cfg.Collective, DType: cfg.DType, Op: cfg.Op, World: cfg.WorldSize,
				Bytes: sh.Bytes, Offset: sh.Offset, Awkward: sh.Awkward, Variant: v.Name(), Algorithm: v.Algorithm, Mode: mode}
			p, xerr := st.explain(sh, v)
			if xerr == nil {
				m.ZeroCopy = p.ZeroCopy
				if v.Algorithm == coll.Auto {
					m.Algorithm = p.Algorithm
				}
			}
			var need int64 // barrier kernels run in rounds through any staging area
			if !cfg.Library.Windowed(cfg.Collective, v.Algorithm, cfg.WorldSize) {
				need = cfg.Library.SlotBound(cfg.Collective, v.Algorithm, cfg.WorldSize, sh.Bytes)
			}
			why := SkipReason(v, sh.Bytes, need, st.plan.Staging, ncclErr)
			if err := st.bufErr[v.Buffers]; err != nil && why == "" {
				why = fmt.Sprintf("%s buffers could not be registered: %v", v.Name(), err)
			}
			if why == "" {
				why = RefusalReason(v, xerr, ncclErr)
			}
			if why != "" {
				m.Skipped = why
				fmt.Fprintf(cfg.Log, "note: %s %s: skipped: %s\n", FormatSize(sh.Bytes), v.Name(), why)
			} else if err := st.measure(ctx, sh, v, &m); err != nil {
				m.Error = err.Error()
				fmt.Fprintf(cfg.Log, "error: %s %s: %v\n", FormatSize(sh.Bytes), v.Name(), err)
				if cerr := st.broken(ctx); cerr != nil {
					group = append(group, m)
					out = append(out, group...)
					fillDerived(out)
					return out, fmt.Errorf("%s at %s left a communicator unusable, sweep stopped: %w", v.Name(), FormatSize(sh.Bytes), cerr)
				}
			}
			if m.CheckFailed() {
				fmt.Fprintf(cfg.Log, "CHECK FAILED: %s %s %s %s: %s\n", cfg.Collective, cfg.DType, FormatSize(sh.Bytes), v.Name(), m.Check)
			}
			group = append(group, m)
			if st.rank == 0 && cfg.Progress != nil {
				cfg.Progress(len(out)+len(group), total, &group[len(group)-1])
			}
		}
		fillDerived(group)
		out = append(out, group...)
	}
	return out, nil
}

// broken reports (agreed) whether any rank's communicator is unusable.
func (st *rankState) broken(ctx context.Context) error {
	return agree(ctx, st.peers, st.c.Err())
}

// issue enqueues collective number i (inputs alternate) of variant v on
// the stream, on the variant's buffers.
func (st *rankState) issue(sh Shape, v Variant, i int) error {
	cfg := st.cfg
	inp, outp := st.bufs[v.Buffers].at(sh, i)
	in, out := comm.DeviceBuffer(inp), comm.DeviceBuffer(outp)
	o := comm.Options{Stream: st.s, Algorithm: v.Algorithm}
	switch cfg.Collective {
	case coll.AllReduce:
		return st.c.AllReduce(in, out, sh.Count, cfg.DType, cfg.Op, o)
	case coll.ReduceScatter:
		return st.c.ReduceScatter(in, out, sh.Count, cfg.DType, cfg.Op, o)
	default:
		return st.c.AllGather(in, out, sh.Count, cfg.DType, o)
	}
}

// explain is the plan of the calls issue makes (the same buffers).
func (st *rankState) explain(sh Shape, v Variant) (comm.Plan, error) {
	cfg := st.cfg
	b := st.bufs[v.Buffers]
	if b == nil { // its buffers could not be set up (bufErr)
		return comm.Plan{}, st.bufErr[v.Buffers]
	}
	in, out := b.at(sh, 0)
	return st.c.Explain(cfg.Collective, comm.DeviceBuffer(in), comm.DeviceBuffer(out), sh.Count, cfg.DType, cfg.Op, comm.Options{Algorithm: v.Algorithm})
}

// issueK enqueues K collectives.
func (st *rankState) issueK(sh Shape, v Variant) error {
	for i := 0; i < st.cfg.OpsPerGraph; i++ {
		if err := st.issue(sh, v, i); err != nil {
			return err
		}
	}
	return nil
}

// event returns rank 0's i-th timing event, creating it on first use.
func (st *rankState) event(i int) (*cuda.Event, error) {
	for len(st.events) <= i {
		e, err := st.dev.NewEvent()
		if err != nil {
			return nil, err
		}
		st.events = append(st.events, e)
	}
	return st.events[i], nil
}

// clockWarmup is how many collectives the first measurement of a sweep
// issues before timing: about 0.1 to 0.2 s of back-to-back small kernels.
const clockWarmup = 20000

// measure checks (optionally), warms up, captures and times one variant at
// one size, filling m on rank 0.
func (st *rankState) measure(ctx context.Context, sh Shape, v Variant, m *Measurement) error {
	cfg := st.cfg
	if err := barrier(ctx, st.peers); err != nil {
		return err
	}
	if cfg.Check {
		res, err := st.check(sh, v)
		if err := agree(ctx, st.peers, err); err != nil {
			return fmt.Errorf("check run: %w", err)
		}
		all, err := st.peers.AllGather(ctx, []byte(res))
		if err != nil {
			return err
		}
		m.Check = "ok"
		var fails []string
		for r, b := range all {
			if len(b) > 0 {
				fails = append(fails, fmt.Sprintf("rank %d: %s", r, b))
			}
		}
		if len(fails) > 0 {
			m.Check = "FAIL: " + strings.Join(fails, "; ")
		}
	}
	// Warm-up (compiles the kernel on first use). The first measurement
	// of a sweep warms much longer, so an idle GPU's clocks have ramped up
	// before the smallest sizes are timed (a fixed count, not a time, so
	// every rank issues the same collectives).
	n := cfg.Warmup
	if !st.warmed {
		st.warmed = true
		n = max(n, clockWarmup)
	}
	err := func() error {
		for i := 0; i < n; i++ {
			if err := st.issue(sh, v, i); err != nil {
				return err
			}
		}
		return st.c.Synchronize(st.s)
	}()
	if err := agree(ctx, st.peers, err); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	// The replay: a graph of K collectives, or K eager launches.
	replay := func() error { return st.issueK(sh, v) }
	if !cfg.Eager {
		ge, err := st.capture(sh, v)
		if err := agree(ctx, st.peers, err); err != nil {
			if ge != nil {
				ge.Destroy()
			}
			return fmt.Errorf("graph capture: %w", err)
		}
		defer ge.Destroy()
		replay = func() error { return ge.Launch(st.s) }
	}
	// Calibrate R.
	r := cfg.Replays
	if r <= 0 {
		ms, err := st.timeReplays(ctx, replay, 1)
		if err != nil {
			return fmt.Errorf("calibration: %w", err)
		}
		var blob [8]byte
		if st.rank == 0 {
			binary.LittleEndian.PutUint64(blob[:], uint64(Replays(ms[0], cfg.TargetMS, cfg.MinReplays, cfg.MaxReplays)))
		}
		all, err := st.peers.AllGather(ctx, blob[:])
		if err != nil {
			return err
		}
		r = int(binary.LittleEndian.Uint64(all[0]))
	}
	ms, err := st.timeReplays(ctx, replay, r)
	if err != nil {
		return err
	}
	if st.rank == 0 {
		per := make([]float64, len(ms))
		for i, t := range ms {
			per[i] = t * 1e3 / float64(cfg.OpsPerGraph)
		}
		m.LatencyUS = bench.Median(per)
		m.MinUS, m.MaxUS = per[0], per[0]
		for _, p := range per {
			m.MinUS, m.MaxUS = math.Min(m.MinUS, p), math.Max(m.MaxUS, p)
		}
		m.Replays, m.OpsPerReplay = r, cfg.OpsPerGraph
	}
	return nil
}

// check runs the variant once from input 0 and verifies this rank's
// output; the returned string is a check failure ("" when correct), the
// error a failure to run.
func (st *rankState) check(sh Shape, v Variant) (string, error) {
	_, out := st.bufs[v.Buffers].at(sh, 0)
	if err := st.dev.Memset8(out, 0xff, int(sh.OutBytes)); err != nil {
		return "", err
	}
	if err := st.issue(sh, v, 0); err != nil {
		return "", err
	}
	if err := st.c.Synchronize(st.s); err != nil {
		return "", err
	}
	got := st.host[:sh.OutBytes]
	if err := st.dev.CopyDtoH(got, out); err != nil {
		return "", err
	}
	if err := Verify(st.cfg.Collective, st.cfg.DType, st.cfg.Op, st.cfg.WorldSize, st.rank, sh, seed0, got, !v.Custom()); err != nil {
		return err.Error(), nil
	}
	return "", nil
}

// capture records K collectives into a graph on the rank's stream.
func (st *rankState) capture(sh Shape, v Variant) (*cuda.GraphExec, error) {
	if err := st.s.BeginCapture(); err != nil {
		return nil, err
	}
	ierr := st.issueK(sh, v)
	g, err := st.s.EndCapture()
	if ierr != nil || err != nil {
		if g != nil {
			g.Destroy()
		}
		return nil, errors.Join(ierr, err)
	}
	defer g.Destroy()
	return g.Instantiate()
}

// timeReplays runs one untimed replay and then n timed ones back to back
// on every rank (after a host barrier), and returns on rank 0 the n replay
// times in milliseconds. Errors are agreed across ranks.
func (st *rankState) timeReplays(ctx context.Context, replay func() error, n int) ([]float64, error) {
	if err := barrier(ctx, st.peers); err != nil {
		return nil, err
	}
	var times []float64
	err := func() error {
		if err := replay(); err != nil {
			return err
		}
		if st.rank == 0 {
			for i := 0; i <= n; i++ {
				if _, err := st.event(i); err != nil {
					return err
				}
			}
			if err := st.events[0].Record(st.s); err != nil {
				return err
			}
		}
		for i := 1; i <= n; i++ {
			if err := replay(); err != nil {
				return err
			}
			if st.rank == 0 {
				if err := st.events[i].Record(st.s); err != nil {
					return err
				}
			}
		}
		if err := st.c.Synchronize(st.s); err != nil {
			return err
		}
		if st.rank == 0 {
			for i := 1; i <= n; i++ {
				ms, err := cuda.ElapsedMS(st.events[i-1], st.events[i])
				if err != nil {
					return err
				}
				times = append(times, float64(ms))
			}
		}
		return nil
	}()
	if err := agree(ctx, st.peers, err); err != nil {
		return nil, err
	}
	if st.rank == 0 && len(times) == 0 {
		return nil, errors.New("no replay times recorded")
	}
	if st.rank != 0 {
		times = make([]float64, n) // placeholders; only rank 0 times
	}
	return times, nil
}
