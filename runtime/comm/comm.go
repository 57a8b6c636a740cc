// Package comm is the Communicator users call: all-reduce, reduce-scatter and
// all-gather over a group of ranks, on GPUs (generated kernels over CUDA IPC
// or peer access, with NCCL as the fallback the spec's selection rules name)
// or on CPUs (the host backend over shared memory), behind one API.
//
// Every rank of a group creates its Communicator with the same Library, group
// name and world size, and then issues the same collectives in the same
// order. New forms the group through the Store (world size, rank set,
// backend and library must agree), and any decision that could differ
// between ranks (the topology, the staging size, whether NCCL is
// available) is agreed there too, so every rank takes the same path for
// every call.
//
// Each call goes through one front end: its arguments are checked (sizes
// overflow-checked before anything multiplies them), it is resolved once
// into a plan (the algorithm, the kernel or NCCL, sizes, zero-copy or
// staged), and the backend executes the plan. Every returned error wraps one
// of the sentinels (ErrInvalidArgument, ErrMismatch, ErrTimeout,
// ErrAborted, ErrClosed, ErrUnsupported, ErrBusy, ErrDevice) for
// errors.Is. EnvDebugCheck turns on a mode that compares every call across
// ranks. See docs/architecture.md.
package comm

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/alloc"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/host"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/symm"
)

// Host is the Config.Device value that selects the host (CPU) backend.
const Host = -1

// EnvFatbin names a fatbin file for GPU ranks whose Config has neither
// Fatbin nor FatbinPath.
const EnvFatbin = "COLLGEN_FATBIN"

// MaxStagingBytes bounds Config.StagingBytes and StagingBudget: 1 TiB,
// beyond any GPU's memory, so the staging region's size (several areas
// per slot) cannot overflow.
const MaxStagingBytes int64 = 1 << 40

// DefaultTimeout bounds each barrier inside a kernel, and each host wait.
const DefaultTimeout = 10 * time.Second

// Config describes one rank's membership of a group.
type Config struct {
	// Rank and WorldSize: this rank's index and the number of ranks.
	Rank, WorldSize int
	// Device is the CUDA device ordinal of this rank, or Host.
	Device int
	// Store is the rendezvous store every rank of the group shares.
	Store rendezvous.Store
	// Library is the generated package's kernel library, e.g.
	// collectives.Library.
	Library *kernels.Library
	// Group names the group; groups sharing a Store need distinct names.
	// A name is formed once at a time: it can be formed again after every
	// member has closed. Default "default".
	Group string
	// Topology is the spec topology whose kernels and selection rules to
	// use. "" lets New choose from what it detects (docs/topology.md): the
	// first topology of the detected kind (nvlink_full on NVSwitch or an
	// NVLink mesh, hybrid_cube_mesh on a DGX-1-style cube, pcie_p2p), NCCL
	// only when some GPU cannot access another's memory, and without NVML
	// the first nvlink_full topology when CUDA finds peer access everywhere;
	// the first host_shm topology for Device: Host. A named GPU topology
	// whose kernels cannot run on the detected GPUs fails New on every rank
	// (ErrUnsupported). With Device: Host a name must be one of the
	// library's host_shm topologies, whose rules then choose (any other
	// name fails New with ErrInvalidArgument).
	Topology string
	// Timeout bounds every wait of a rank for a peer once the group has
	// formed; a kernel that waits longer reports a timeout instead of
	// hanging. Default DefaultTimeout. New's wait for every rank to join
	// is bounded by its ctx's deadline instead, or, when ctx has none, by
	// rendezvous.DefaultTimeout (5 minutes: processes start apart).
	Timeout time.Duration
	// StagingBytes sizes the registered staging buffer (GPU): each stage
	// slot holds one area per kernel protocol (barrier, ll, ll128), and
	// StagingBytes sets every area. 0 sizes each area for the largest
	// message the topology's rules send to a kernel of its protocol in one
	// round, at most kernels.WindowBytes for kernels that run larger
	// messages in rounds (barrier kernels, and the push kernels whose
	// schedule allows it, kernels.Kernel.PushRounds), the whole inbox for
	// other push kernels, and then cuts the areas to fit StagingBudget. A
	// smaller value bounds the memory: kernels with rounds then run more,
	// and the automatic choice moves a call of a push kernel without rounds
	// that does not fit to the one-shot. A larger value lets push kernels
	// without rounds take larger messages, and others run fewer rounds;
	// barrier kernels still run messages over kernels.WindowBytes in windows
	// of that size (faster than one round, see gpuComm.prepare). Negative,
	// or over MaxStagingBytes, is refused (ErrInvalidArgument).
	StagingBytes int64
	// StagingBudget bounds the staging buffer when StagingBytes is 0: a
	// rank's two stage slots, scratch buffer and signal pad together, in
	// bytes (default DefaultStagingBudget, 32 MiB). The areas the rules
	// would need beyond it shrink to one common cap, and their kernels run
	// more rounds; only the inboxes of push kernels without rounds are never
	// cut, and no area goes below 1 MiB, so a budget under that floor
	// (13.5 MiB at world 2 with the shipped rules) is refused with
	// ErrInvalidArgument naming it. Every rank must pass the same value;
	// negative, or over MaxStagingBytes, is refused.
	StagingBudget int64
	// MaxBlocks caps the blocks (CTAs) of every generated kernel launch on
	// this rank's GPU, as NCCL's maxCTAs does: the SMs it leaves free run
	// the compute that overlaps the collectives. Kernels with larger
	// messages then loop more; results are the same. 0 keeps each kernel's
	// spec max_blocks, except where several ranks share one GPU: their
	// kernels wait for each other, so all their blocks must be resident at
	// once, and New then caps grids at the SM count over the most ranks on
	// one GPU. A larger value than a kernel's max_blocks changes nothing.
	// Every rank must pass the same value (ErrMismatch): a kernel's blocks
	// meet their peers' blocks of the same index.
	MaxBlocks int
	// DisableNCCL keeps NCCL unloaded; sizes the rules give to NCCL then
	// fail with an error saying so.
	DisableNCCL bool
	// Fatbin is a fatbin image (e.g. //go:embed of one `collgen fatbin`
	// built) to load kernels from instead of compiling the library's
	// sources with NVRTC; it must hold code for the device's architecture
	// (else New fails with a *cuda.FatbinError naming both; there is no
	// fallback to NVRTC). Fatbin wins over FatbinPath.
	Fatbin []byte
	// FatbinPath is a fatbin file to load kernels from, as Fatbin; ""
	// means $COLLGEN_FATBIN (EnvFatbin), and NVRTC when that is unset too.
	FatbinPath string
	// Cache is the NVRTC cache; nil uses cuda.DefaultCache when a cache
	// directory can be found, and compiles without caching otherwise.
	// Processes of one host sharing it compile each kernel once between
	// them (see cuda.Builder).
	Cache *cuda.Cache
	// LazyKernels loads each kernel on the first call that needs it
	// instead of in New. By default New compiles (in parallel, through
	// the cache) or loads every kernel of the world size, so no call
	// stalls on a compile and a kernel that fails to compile fails New
	// with a *KernelError naming it. Where ranks of one process share a
	// GPU (one CUDA context), New loads them anyway: a kernel's first
	// load may synchronize the context and so wait for a peer's kernel
	// that waits for this rank.
	LazyKernels bool
	// HostShared selects POSIX shared memory for Device: Host (ranks are
	// processes); false means ranks are goroutines of one process.
	HostShared bool
	// Allocator, when set on a GPU communicator that opens NCCL, has
	// every segment registered with NCCL: those it holds at New, each new
	// one through its hook, each deregistered before the allocator frees
	// it, and all at Close and Abort (see docs/registration.md). It must
	// allocate on this rank's device. Ignored when NCCL is not opened, or
	// is older than 2.19 (no ncclCommRegister; RegisterBuffer then returns
	// ErrUnsupported naming the version).
	Allocator *alloc.Allocator
	// NoEarlyLaunch launches every kernel plainly. By default, on sm_90
	// and later with a CUDA 12 driver, each generated kernel is launched
	// with programmatic dependent launch (PDL): the GPU schedules it while
	// the kernel ahead of it on the stream still runs, and it waits there
	// (griddepcontrol.wait) until that kernel has finished and its writes
	// are visible, before touching memory; in a CUDA graph the capture
	// records a programmatic edge. That hides most of the launch gap
	// between back-to-back kernels (about 0.4 us of a 1 KiB all-reduce on
	// H200; docs/performance.md). A rank whose CUDA context holds another
	// rank of the group (goroutine ranks on one GPU; under MPS, any ranks
	// on one GPU) never launches early: the waiting blocks could take the
	// SMs its peers' kernels need (docs/reliability.md, case 97). With
	// plain launches and CUDA_DEVICE_MAX_CONNECTIONS=1, Abort releases
	// kernels waiting for a peer only at Config.Timeout (case 35, open).
	NoEarlyLaunch bool
	// NCCLWindows registers Alloc's buffers as NCCL windows (see Alloc),
	// like sglang's symmetric-memory option. Off by default: sglang
	// measured windows slower than plain NCCL at 64-256 MiB on H200.
	NCCLWindows bool
	// NCCLNonBlocking opens the NCCL communicator non-blocking (across
	// hosts, both: the cross-host and the all-rank one)
	// (ncclCommInitRankConfig with blocking = 0): its initialisation is
	// then bounded by New's context and every later NCCL operation by
	// Timeout, including a first collective whose connection set-up waits
	// for a peer that never comes. Off by default: the blocking
	// communicator is the one proven on GPUs; both bound a wait for an
	// enqueued NCCL collective by Timeout (Synchronize polls NCCL's
	// asynchronous error and aborts the communicator).
	NCCLNonBlocking bool
	// HostID names this rank's host; ranks with the same id form one host
	// (CUDA IPC among them). "" uses $COLLGEN_HOST_ID, else the hostname
	// and boot id. A group spanning hosts runs the hierarchical
	// collectives (hier.go); see docs/multihost.md.
	HostID string
	// MultiHostRules are the selection rules of a group spanning hosts,
	// per collective: each rule names coll.Hierarchical or coll.NCCL (over
	// all ranks). A collective without rules uses coll.Hierarchical. Nil
	// uses the library's (the spec's multi_host.select). Ignored on one
	// host.
	MultiHostRules map[coll.Collective][]kernels.Rule
}

// Options tune one call.
type Options struct {
	// Stream orders the collective on the GPU; nil uses the communicator's
	// own stream (and the call then waits for completion).
	Stream *cuda.Stream
	// Algorithm forces a generated algorithm (coll.OneShot, coll.TwoShot,
	// coll.HCM, coll.OneShotLL, ...) or coll.NCCL; coll.Auto selects by
	// size with the spec's rules. A forced algorithm that cannot run is an
	// error saying why (ErrUnsupported or ErrInvalidArgument), never
	// silently replaced.
	Algorithm coll.Algorithm
	// Tag identifies a host collective across ranks (see host.Options).
	Tag uint64
	// Context bounds host-side waits and the debug check's exchange; nil
	// means context.Background. A call whose Context is already done
	// returns at once without taking part (ErrAborted when cancelled,
	// ErrTimeout past its deadline), like a rank that did not call.
	Context context.Context
}

func (o Options) ctx() context.Context {
	if o.Context != nil {
		return o.Context
	}
	return context.Background()
}

// Communicator is one rank's handle on a group. Its collectives run
// through one front end (call.go): a call is checked and resolved once
// into a plan, which the backend executes.
type Communicator struct {
	cfg    Config
	base   string // store keys of the group name: "collgen/comm/<group>/"
	id     string // this formation's nonce
	prefix string // store keys of this formation: base + id + "/"
	record []byte // the world record this formation was made under
	// exchanged is set once this rank took part in the membership
	// exchange: its leave then marks the formation closing (group.go).
	exchanged bool
	b         backend
	gpu       *gpuComm // nil on the host backend and across hosts
	// hier is the backend of a GPU group spanning hosts (hier.go), nil on
	// one host; layout groups the ranks by host (hosts.go).
	hier   *hierComm
	hostID string
	layout hostLayout
	// busy is held for the whole of a GPU call: calls on one GPU
	// communicator share sequence counters and stage slots, so a second
	// goroutine arriving meanwhile gets ErrBusy instead of racing them.
	busy sync.Mutex
	// cur is the plan of the GPU call in progress (see do): written and
	// read only while busy is held, and not kept by anything past the
	// call.
	cur call
	// check is non-nil in the debug check mode (EnvDebugCheck).
	check *checker
	// closed is set by Close and Abort; later calls return ErrClosed.
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	// aborted is set by Abort (abort.go); later calls return ErrAborted.
	// waiting is held for reading by Synchronize, which does not hold
	// busy; Abort takes it for writing before releasing the device.
	aborted atomic.Bool
	waiting sync.RWMutex
	// ended is cancelled when Abort (or a host Close) begins: it ends a
	// store exchange with the peers that no kernel bounds (the debug
	// check's, UseSymmetric's; see exchange). exchanging is held for
	// reading by such an exchange (host calls do not hold busy); Close
	// and Abort take it before leaving the group, so no exchange writes
	// the store after the last rank's forget.
	ended      context.Context
	end        context.CancelFunc
	exchanging sync.RWMutex
	// reg owns the NCCL registrations (register.go); nil without NCCL.
	reg *registry
}

// New joins the group described by cfg. It is collective: every rank must
// call it (goroutine ranks concurrently). Ranks agree through the store on
// the world size, the rank set, the backend and the library before
// anything is set up (an error wrapping ErrMismatch names both values),
// then the backend sets up. A rank that never calls New makes the others
// fail with ErrTimeout naming it at ctx's deadline, or after
// rendezvous.DefaultTimeout (5 minutes) when ctx has none: give ctx a
// deadline to wait less.
func New(ctx context.Context, cfg Config) (*Communicator, error) {
	return newComm(ctx, cfg, openDevice)
}

// newComm is New with the GPU device opener as a parameter (tests pass a
// fake).
func newComm(ctx context.Context, cfg Config, open func(Config) (device, error)) (*Communicator, error) {
	if cfg.WorldSize < 1 {
		return nil, errorf(ErrInvalidArgument, "comm: world size %d must be at least 1", cfg.WorldSize)
	}
	if cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize {
		return nil, errorf(ErrInvalidArgument, "comm: rank %d out of range for world size %d", cfg.Rank, cfg.WorldSize)
	}
	if cfg.Store == nil {
		return nil, errorf(ErrInvalidArgument, "comm: Config.Store is nil; ranks need a rendezvous store (rendezvous.NewMemStore for goroutine ranks)")
	}
	if cfg.Library == nil {
		return nil, errorf(ErrInvalidArgument, "comm: Config.Library is nil; pass your generated package's Library")
	}
	if cfg.Device < Host {
		return nil, errorf(ErrInvalidArgument, "comm: Config.Device %d: want a CUDA device ordinal (0, 1, ...) or comm.Host", cfg.Device)
	}
	if cfg.MaxBlocks < 0 {
		return nil, errorf(ErrInvalidArgument, "comm: Config.MaxBlocks %d: want 0 (each kernel's spec max_blocks) or a positive block count", cfg.MaxBlocks)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"StagingBytes", cfg.StagingBytes}, {"StagingBudget", cfg.StagingBudget}} {
		if f.v < 0 || f.v > MaxStagingBytes {
			return nil, errorf(ErrInvalidArgument, "comm: Config.%s %d: want 0 (the default) or a positive size of at most %d bytes (MaxStagingBytes)", f.name, f.v, MaxStagingBytes)
		}
	}
	if cfg.Group == "" {
		cfg.Group = "default"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	c := &Communicator{cfg: cfg}
	c.ended, c.end = context.WithCancel(context.Background())
	var err error
	if c.hostID, err = hostID(cfg); err != nil {
		return nil, err
	}
	if on, err := debugCheckEnabled(); err != nil {
		return nil, err
	} else if on {
		c.check = &checker{}
	}
	hostCfg := host.Config{Rank: cfg.Rank, WorldSize: cfg.WorldSize, Store: cfg.Store,
		Group: cfg.Group, Library: cfg.Library, Shared: cfg.HostShared, Timeout: cfg.Timeout}
	if cfg.Device == Host {
		if err := checkHostTopology(cfg.Library, cfg.Topology); err != nil {
			return nil, err
		}
		// host.New only checks its configuration (set-up is lazy), so it
		// runs before the group forms: a bad one fails at once.
		if _, err := host.New(ctx, hostCfg); err != nil {
			return nil, errorf(ErrInvalidArgument, "comm: rank %d: %w", cfg.Rank, err)
		}
	}
	if err := c.form(ctx); err != nil {
		return nil, err
	}
	if c.layout.multi() {
		return c.spanHosts(ctx, open)
	}
	if cfg.Device == Host {
		// The host group's keys live under this formation's id: the store
		// still holds an earlier formation's of the same name (its nonce,
		// created and mapped marks), which a new set-up must not meet.
		hostCfg.Group = cfg.Group + "/" + c.id
		g, err := host.New(ctx, hostCfg)
		if err != nil {
			return nil, errors.Join(errorf(ErrInvalidArgument, "comm: rank %d: %w", cfg.Rank, err), c.leave())
		}
		c.b = &hostBackend{g: g, lib: cfg.Library, world: cfg.WorldSize, topology: cfg.Topology}
	} else {
		g, err := newGPU(ctx, cfg, c.prefix, open)
		if err != nil {
			// Give up the claim, so the group name can be formed again.
			return nil, errors.Join(classify(err), c.leave())
		}
		c.b, c.gpu = g, g
		if err := c.attachRegistry(); err != nil {
			return nil, errors.Join(err, g.dev.release(), c.leave())
		}
	}
	return c, nil
}

// Rank returns this rank's index.
func (c *Communicator) Rank() int { return c.cfg.Rank }

// WorldSize returns the number of ranks.
func (c *Communicator) WorldSize() int { return c.cfg.WorldSize }

// AllReduce combines count elements of every rank's in with op and writes
// the result to every rank's out. in and out may be the same buffer.
func (c *Communicator) AllReduce(in, out Buffer, count int, dtype coll.DType, op coll.Op, o Options) error {
	return c.do(call{collective: coll.AllReduce, in: in, out: out, count: int64(count), dtype: dtype, op: op, o: o})
}

// ReduceScatter combines every rank's in (WorldSize*recvCount elements) with
// op; rank r receives elements [r*recvCount, (r+1)*recvCount) in out. For
// in-place use pass out = in + r*recvCount elements.
func (c *Communicator) ReduceScatter(in, out Buffer, recvCount int, dtype coll.DType, op coll.Op, o Options) error {
	return c.do(call{collective: coll.ReduceScatter, in: in, out: out, count: int64(recvCount), dtype: dtype, op: op, o: o})
}

// AllGather concatenates every rank's in (sendCount elements) in rank order
// into every rank's out (WorldSize*sendCount elements). For in-place use
// pass in = out + r*sendCount elements.
func (c *Communicator) AllGather(in, out Buffer, sendCount int, dtype coll.DType, o Options) error {
	return c.do(call{collective: coll.AllGather, in: in, out: out, count: int64(sendCount), dtype: dtype, o: o})
}

// Plan is what a collective call would run.
type Plan struct {
	// Algorithm is a generated algorithm, coll.NCCL, or coll.Copy (a
	// communicator of one rank; see prepare in gpu.go).
	Algorithm coll.Algorithm
	// Kernel names the generated kernel; "" for NCCL and host calls.
	Kernel string
	// ZeroCopy: the kernel reads the input in place from symmetric memory.
	ZeroCopy bool
	// Rounds is how many rounds the kernel runs: 1, or more for a staged
	// barrier kernel whose message is larger than its staging area (it
	// then stages one window of every chunk per round); 0 for NCCL and
	// host calls.
	Rounds int64
}

// Explain resolves a call exactly as AllReduce, ReduceScatter or AllGather
// would with these arguments (count as each of them takes it; op is
// ignored for all-gather) and reports its plan without running anything.
// It is local: no rank waits for another. A count of 0 plans nothing and
// returns the zero Plan.
func (c *Communicator) Explain(collective coll.Collective, in, out Buffer, count int, dtype coll.DType, op coll.Op, o Options) (Plan, error) {
	if err := c.gone("Explain"); err != nil {
		return Plan{}, err
	}
	if !collective.Reduces() {
		op = ""
	}
	cl := &call{collective: collective, in: in, out: out, count: int64(count), dtype: dtype, op: op, o: o}
	if err := c.resolve(cl); err != nil || cl.n == 0 {
		return Plan{}, err
	}
	p := Plan{Algorithm: cl.alg, ZeroCopy: cl.zc.on()}
	if cl.kernel != nil {
		p.Kernel = cl.kernel.Name
		p.Rounds = 1
		if cl.window > 0 {
			p.Rounds = (cl.chunk + cl.window - 1) / cl.window
		}
	}
	return p, nil
}

// Choose returns the algorithm automatic selection picks for a message of
// the given size in bytes (for all-gather and reduce-scatter: the full,
// gathered size) with a staged input, through the same resolution a call
// makes (an input in symmetric memory may select otherwise: Explain takes
// the buffers and says what a call runs); it checks its
// arguments (an unknown dtype or op is ErrInvalidArgument) and fails when
// nothing can run the message.
func (c *Communicator) Choose(collective coll.Collective, bytes int64, dtype coll.DType, op coll.Op) (coll.Algorithm, error) {
	cl, err := c.chooseCall(collective, bytes, dtype, op)
	if err != nil {
		return "", err
	}
	if err := c.choose(cl); err != nil {
		return "", err
	}
	return cl.alg, nil
}

// Alloc returns a symmetric device buffer of the given size: every rank
// allocates one in the same call (it is collective), and all-reduce,
// reduce-scatter and all-gather calls whose input lies in such a buffer
// read it in place instead of copying it into the staging buffer
// (zero-copy). The choice is
// made per call from the input address and is not agreed through the store,
// so every rank must pass a symmetric input (at the same offset) in the
// same calls: a call where some ranks do and others do not runs kernels
// with different barrier counts, which then report a TimeoutError (the
// debug check mode, EnvDebugCheck, names the rank instead). With
// Config.NCCLWindows and NCCL 2.27 or newer, the buffer is also registered
// as an NCCL window (RegisterWindow), so sizes the rules give to NCCL run
// NCCL's symmetric kernels on it; a failed registration is an error (the
// buffer then stays allocated until Close). Freed by Close. GPU only.
func (c *Communicator) Alloc(ctx context.Context, bytes int) (cuda.DevicePtr, error) {
	if c.gpu == nil && c.hier == nil {
		return 0, errorf(ErrInvalidArgument, "comm: Alloc is for GPU communicators; host buffers are plain memory (HostBuffer, HostSlice)")
	}
	if bytes <= 0 || bytes > symm.MaxAllocBytes {
		return 0, errorf(ErrInvalidArgument, "comm: Alloc of %d bytes: want a positive size of at most %d (symm.MaxAllocBytes)", bytes, symm.MaxAllocBytes)
	}
	// busy keeps Close and Abort from releasing the device under the
	// allocation (they wait for it: it is bounded by ctx and
	// Config.Timeout); checked again once held.
	c.busy.Lock()
	defer c.busy.Unlock()
	if err := c.gone("Alloc"); err != nil {
		return 0, err
	}
	if c.hier != nil {
		p, err := c.hier.alloc(ctx, bytes)
		return p, classify(err)
	}
	p, err := c.gpu.alloc(ctx, bytes)
	if err != nil {
		return 0, classify(err)
	}
	return p, c.allocWindow(ctx, p, bytes)
}

// Synchronize waits for the stream (nil: the communicator's own) and then
// returns any error a kernel reported, such as a timeout waiting for a peer.
// After Close or Abort it returns ErrClosed or ErrAborted.
func (c *Communicator) Synchronize(s *cuda.Stream) error {
	// waiting keeps Close and Abort from releasing the device under this
	// wait.
	c.waiting.RLock()
	defer c.waiting.RUnlock()
	if err := c.gone("Synchronize"); err != nil {
		return err
	}
	if c.hier != nil {
		return classify(c.hier.synchronize(s))
	}
	if c.gpu == nil {
		return nil
	}
	if err := c.gpu.synchronize(s); err != nil {
		if c.aborted.Load() {
			return c.abortedError("Synchronize")
		}
		return classify(err)
	}
	return nil
}

// Err returns the first error a kernel reported without waiting for the
// stream, or nil; after Close or Abort, ErrClosed or ErrAborted. The first
// report of a kernel's timeout (by Err, a call or Synchronize, whichever
// sees it first) takes up to 2 seconds more: it asks the peer that was
// waited for what it issued (TimeoutError.Calls), and, where that peer
// issued the same calls, every rank, for up to 2 seconds again.
func (c *Communicator) Err() error {
	c.waiting.RLock() // the status word lives until Close or Abort
	defer c.waiting.RUnlock()
	if err := c.gone("Err"); err != nil {
		return err
	}
	if c.hier != nil {
		return classify(c.hier.statusErr())
	}
	if c.gpu == nil {
		return nil
	}
	return classify(c.gpu.statusErr())
}

// Device returns the CUDA device of a GPU communicator, nil on the host.
func (c *Communicator) Device() *cuda.Device {
	if c.hier != nil {
		return c.hier.dev.cudaDevice()
	}
	if c.gpu == nil {
		return nil
	}
	return c.gpu.dev.cudaDevice()
}

// Stream returns the GPU communicator's own stream, nil on the host.
func (c *Communicator) Stream() *cuda.Stream {
	if c.hier != nil {
		return c.hier.dev.stream()
	}
	if c.gpu == nil {
		return nil
	}
	return c.gpu.dev.stream()
}

// Close releases everything the communicator owns (IPC mappings, staging
// and symmetric buffers, the NCCL communicator, shared memory) and this
// rank's claim on the group name. It is collective on the GPU: ranks wait
// for each other before freeing memory peers may still map. Close is safe
// to call twice; calls after it return ErrClosed.
func (c *Communicator) Close() error {
	c.closed.Store(true)
	if c.gpu == nil && c.hier == nil {
		// Host calls do not hold busy and Close does not wait for them:
		// their exchanges end now. A GPU call in flight holds busy, and
		// Close waits for it to complete with its peers, debug check or
		// not (ending its exchange failed a call the peers still ran).
		c.endExchanges()
	}
	c.closeOnce.Do(func() {
		// Wait for a GPU call in flight on another goroutine, and for
		// Synchronize and Err, before releasing what they use.
		c.busy.Lock()
		defer c.busy.Unlock()
		c.waiting.Lock()
		defer c.waiting.Unlock()
		// Registrations go after the collectives queued on the own stream
		// (best effort: close reports the stream's error) and before the
		// NCCL communicator does.
		if c.gpu != nil {
			c.gpu.dev.synchronize(nil)
		}
		if b := c.book(); b != nil {
			// For a peer whose kernel waits for a call this rank never
			// issued; before the backend's close barrier.
			b.tellEnd("closed")
		}
		rerr := classify(c.reg.closeAll(false))
		var (
			berr       error
			freeRegion func() error
		)
		if c.gpu != nil {
			// Abort meanwhile ends the close barrier's wait for peers; the
			// region then stays for them, as after Abort (freeWhenLeft).
			freeRegion, berr = c.gpu.closeOrPark()
		} else {
			berr = c.b.close()
		}
		c.waitExchanges()
		c.closeErr = errors.Join(rerr, classify(berr), c.leave())
		if freeRegion != nil {
			go c.freeWhenLeft(freeRegion, parkBound(c.cfg.Timeout))
		}
	})
	return c.closeErr
}
