package comm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/schedule"
)

// gpuComm is the GPU backend's pure part: it decides, the device acts.
// Memory, per rank, all owned and freed by the device:
//
//	region   [stage slot 0][stage slot 1][scratch][signal pad], exported
//	         to peers (peers read stage and scratch, write inbox lines into
//	         stage, and write their arrival flags into the signal pad);
//	         consecutive collectives alternate stage slots, which lets the
//	         kernels skip their final barrier (see the CUDA header). A slot
//	         holds one area per protocol the library's kernels use at this
//	         world size (barrier, ll, ll128; see area and areaStage): a push
//	         kernel reads a line's flag words, and only lines of its own
//	         protocol are sure to hold an older flag there (a barrier
//	         kernel's staged data, or another line format, could hold any
//	         bits, the current flag included). Scratch, used by barrier
//	         kernels only, is as large as the barrier area.
//	seq      MaxBlocks barrier sequence counters plus the collective and
//	         finished-block counters and the LL abort word (local)
//	status   one pinned, device-mapped word where kernels report timeouts
//	symm     the communicator's symmetric-memory pool (Alloc), made on
//	         first use; inputs in it, or in a pool given to UseSymmetric,
//	         are read in place (zeroCopy)
//
// All are zeroed before the store barrier that ends New, so no peer ever
// sees a stale flag. Close waits for every rank (store barrier) before the
// device frees anything, because peers may still read this rank's memory.
type gpuComm struct {
	cfg    Config
	lib    *kernels.Library
	dev    device
	world  int
	prefix string // store keys

	topology string            // "" : NCCL only (detect.go)
	kind     coll.TopologyKind // the topology's kind
	det      *Detected         // what New detected; nil for world size 1
	// sameContext[r]: rank r is of this process on this rank's GPU, so it
	// shares its CUDA context (set in setup; nil for none); a timeout
	// waiting for such a rank carries a hint (statusErr).
	sameContext []bool
	// corner is the cube corner (kernel rank) each rank plays when the hcm
	// kernels need another rank order than the communicator's, and
	// atCorner its inverse; both nil otherwise (set once by pickTopology,
	// read on every call).
	corner, atCorner []int
	sels             map[coll.Collective]*kernels.Selection
	protocols        []coll.Protocol         // the library's at this world, in region order
	area             map[coll.Protocol]int64 // bytes of each protocol's area in a stage slot
	slotBytes        int64                   // one stage slot: the sum of the areas
	scratchBytes     int64                   // the scratch buffer (fitAreas)

	areaStage map[coll.Protocol][]cuda.DevicePtr // by rank: the protocol's area in slot 0
	scratch   []cuda.DevicePtr
	signal    []cuda.DevicePtr
	seq       cuda.DevicePtr
	statusPtr cuda.DevicePtr
	packers   map[*kernels.Kernel]*packer // every kernel of this world size

	ncclOK  bool
	ncclErr error // why NCCL cannot be used, agreed by all ranks

	// early: kernels are launched with programmatic dependent launch
	// (Config.NoEarlyLaunch unset, the device supports it, and no other
	// rank shares the context; set in setup). A rank's
	// choice is its own: the kernels wait for the kernel ahead of them on
	// their own stream only (cg_grid_begin), so ranks need not agree.
	early bool

	// maxBlocks caps every launch's grid (gridFor): Config.MaxBlocks, or
	// where ranks share a GPU and that is 0, the least of the ranks'
	// sharedBlocks; 0: each kernel's spec max_blocks. Agreed in setup.
	maxBlocks int

	// inPlace says, per kernel, where a symmetric input stands in for the
	// kernel's stage slot (see stageMapping); absent: it never does.
	inPlace map[*kernels.Kernel]stageMap

	// argBuf and zcBuf are the launch's argument struct and a zero-copy
	// call's stage pointers, reused by every call: run is reached only
	// through Communicator.do, which holds Communicator.busy for the whole
	// call, so one call at a time writes them; and the device keeps
	// nothing of argBuf after launch returns (cuLaunchKernel copies the
	// parameter values, into the graph node under stream capture too).
	// argBuf is an allocation of its own, holding no Go pointers, as cgo
	// requires of the memory a pointer passed to C points into.
	argBuf []byte
	zcBuf  []cuda.DevicePtr

	// broken is the error every later call returns once the communicator
	// is unusable (a kernel's timeout, or Abort). It is set once, by the
	// first setBroken, and read without a lock on every call.
	broken atomic.Pointer[error]
	// breaking is held by the statusErr that turns a kernel's timeout
	// into broken (diagnose waits inside it), so concurrent callers
	// return its error rather than diagnose again.
	breaking sync.Mutex
	// calls are the latest calls, for diagnose (calllog.go).
	calls *callBook
}

// zeroCopy is a call whose input peers read in place: the input lies at
// offset in a symmetric buffer of which peers gives every rank's copy.
// The zero value (peers nil) is a staged call.
type zeroCopy struct {
	offset int64
	peers  peerTable
}

// on reports whether the call reads its input in place.
func (z zeroCopy) on() bool { return z.peers != nil }

// peerTable gives every rank's address of one symmetric buffer, by rank
// (a *symm.Handle; a table in fakes).
type peerTable interface{ Peer(rank int) uintptr }

// stageMap is how a kernel's schedule fills its stage slot: only by
// copying this rank's input into it, input chunk c landing in stage chunk
// c+delta[rank]. A symmetric input can then stand in for every rank's
// slot: stage[r] = (rank r's input) - lo(delta[r]) elements, so the copies
// find source and destination equal and skip, and peers read the input
// where the kernel would have read the slot.
type stageMap struct{ delta []int }

// stageMapping derives k's stageMap from its schedule; ok is false when
// any step writes the stage with anything but such a copy (the input would
// be overwritten, or the slot holds more than the input) or none fills it.
func stageMapping(s *schedule.Schedule) (stageMap, bool) {
	m := stageMap{delta: make([]int, s.World)}
	seen := false
	for r := range s.World {
		first := true
		for _, ph := range s.Phases {
			for _, st := range ph.Steps {
				if st.Dst.Buf != schedule.Stage {
					continue
				}
				src := st.Srcs[0]
				if st.Kind != schedule.Copy || len(st.Srcs) != 1 || src.Buf != schedule.Input || !st.Dst.Rank.IsSelf() {
					return stageMap{}, false
				}
				d := st.Dst.Chunk.Eval(r, s.World) - src.Chunk.Eval(r, s.World)
				if !first && d != m.delta[r] {
					return stageMap{}, false
				}
				m.delta[r], first, seen = d, false, true
			}
		}
	}
	return m, seen
}

// regionAlign keeps every part of the region 256-byte aligned (LL128
// kernels need their stage slots 128-byte aligned).
const regionAlign = 256

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// gpuAgreement is what every GPU rank publishes in New; all must match.
type gpuAgreement struct {
	Topology string `json:"topology"`
	// Areas is the stage slot's layout (each protocol's area and the
	// scratch buffer): kernels address peers' areas at this rank's
	// offsets, so every rank needs the same, not only the same total.
	Areas string `json:"areas"`
	// NCCLWindows (Config.NCCLWindows) decides whether Alloc registers a
	// window, a collective NCCL call: a rank alone with it waits for peers
	// that never come.
	NCCLWindows bool `json:"nccl_windows"`
	// MaxBlocks is Config.MaxBlocks: block b of one rank's kernel meets
	// block b of every peer's, so all must launch the same grids.
	MaxBlocks int `json:"max_blocks"`
	// SharedBlocks is this rank's cap when ranks share its GPU and
	// MaxBlocks is 0 (sharedBlocks); 0 otherwise. Ranks take the least.
	SharedBlocks int    `json:"shared_blocks"`
	NCCL         string `json:"nccl"` // "" when this rank could load NCCL, else why not
	// Process names this rank's process (host name and pid), so that a
	// rank knows which peers share its CUDA context (sharesContext).
	Process string `json:"process"`
	// WorkQueues is the hardware work queues of this rank's CUDA context
	// (device.workQueues); ranks sharing a context need the most
	// (sharedQueues).
	WorkQueues int `json:"work_queues"`
}

// thisProcess is gpuAgreement.Process for this process.
var thisProcess = func() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}()

// sharesContext reports whether another rank of this process is on this
// rank's GPU (goroutine ranks sharing one): one CUDA context, where a
// call that waits for the whole context waits for the peers' kernels.
// Process ranks sharing a GPU have contexts of their own.
func sharesContext(det *Detected, me int, all []gpuAgreement) bool {
	return contextPeer(det, me, all) >= 0
}

// contextPeer is the first other rank of this process on rank me's GPU,
// or -1 (none, or no detection: one rank).
func contextPeer(det *Detected, me int, all []gpuAgreement) int {
	for r := range all {
		if inContext(det, me, r, all) {
			return r
		}
	}
	return -1
}

// inContext reports whether rank r is another rank of rank me's process
// on its GPU, and so shares its CUDA context (false without detection).
func inContext(det *Detected, me, r int, all []gpuAgreement) bool {
	return det != nil && r != me && all[r].Process == all[me].Process && det.BusIDs[r] == det.BusIDs[me]
}

// sharedQueues refuses a set-up where ranks of one process share a GPU
// (one CUDA context) with fewer than the most hardware work queues CUDA
// gives a context (cuda.MaxWorkQueues). A context's streams share its
// queues, and a queue starts its work in order: with two ranks' streams
// on one queue, a rank's next collective, queued behind its running one,
// holds up the peer's collective queued after it, which the running one
// waits for; both wait until Config.Timeout. CUDA gives no way to pick a
// stream's queue; the most queues keep the ranks' streams apart unless
// the process makes many more streams. Every rank decides from the same
// agreement, so all refuse together and none waits for a refused peer.
func sharedQueues(det *Detected, all []gpuAgreement) error {
	for r, a := range all {
		if p := contextPeer(det, r, all); p >= 0 && a.WorkQueues < cuda.MaxWorkQueues {
			why := "collgen sets it when it is unset"
			if cuda.UnderMPS() {
				why = "collgen leaves it unset where an MPS daemon runs: MPS clients share one pool of queues, and at 32 each only about three processes fit on a GPU"
			}
			return errorf(ErrUnsupported, "comm: ranks %d and %d share GPU %s in one process, whose CUDA context has %d hardware work queues (%s): kernels of two ranks on one queue can wait for each other until Config.Timeout; start the process with %s=%d (%s), or give each rank a GPU or a process of its own",
				r, p, det.BusIDs[r], a.WorkQueues, cuda.EnvMaxConnections, cuda.EnvMaxConnections, cuda.MaxWorkQueues, why)
		}
	}
	return nil
}

// contextSharer is a device that frees differently where another rank of
// the process shares its CUDA context (cudaDevice: gpuGate).
type contextSharer interface {
	shareContext()
}

// newGPU opens the rank's device and sets up the GPU backend on it.
func newGPU(ctx context.Context, cfg Config, prefix string, open func(Config) (device, error)) (*gpuComm, error) {
	// The device first: without one, what to set (Config.Device) matters
	// more than which world sizes the library has kernels for.
	dev, err := open(cfg)
	if err != nil {
		return nil, err
	}
	det, err := detect(ctx, cfg, prefix, dev)
	if err != nil {
		return nil, errors.Join(err, dev.release())
	}
	g, err := newGPUState(cfg, prefix, det)
	if err != nil {
		return nil, errors.Join(err, dev.release())
	}
	if err := g.setup(ctx, dev); err != nil {
		return nil, errors.Join(err, dev.release())
	}
	return g, nil
}

// newGPUState builds the pure state: topology (for the detection det, see
// detect.go), areas, argument packers.
func newGPUState(cfg Config, prefix string, det *Detected) (*gpuComm, error) {
	g := &gpuComm{cfg: cfg, lib: cfg.Library, world: cfg.WorldSize, prefix: prefix, det: det,
		sels: map[coll.Collective]*kernels.Selection{}, packers: map[*kernels.Kernel]*packer{},
		inPlace: map[*kernels.Kernel]stageMap{}, zcBuf: make([]cuda.DevicePtr, cfg.WorldSize)}
	g.calls = newCallBook(cfg, prefix)
	if cfg.WorldSize == 1 {
		// One rank: every call is a copy (prepare), so there is no
		// topology, kernel, staging region or NCCL to set up. A topology
		// named anyway must still be one of the library's.
		return g, g.checkNamedTopology()
	}
	if err := g.pickTopology(); err != nil {
		return nil, err
	}
	for i := range g.lib.Kernels {
		k := &g.lib.Kernels[i]
		if k.World != g.world {
			continue
		}
		if k.Launch.MaxBlocks > g.lib.MaxBlocks {
			return nil, errorf(ErrInvalidArgument, "comm: kernel %s launches %d blocks, more than the library's MaxBlocks %d; regenerate", k.Name, k.Launch.MaxBlocks, g.lib.MaxBlocks)
		}
		p, err := newPacker(k, i, g.world)
		if err != nil {
			return nil, err
		}
		g.packers[k] = p
		if p.size > len(g.argBuf) {
			g.argBuf = make([]byte, p.size)
		}
		if k.Protocol.Push() {
			continue // push kernels send from the input; they stage nothing
		}
		sched, err := schedule.Build(k.Collective, k.Algorithm, k.World)
		if err != nil {
			return nil, errorf(ErrInvalidArgument, "comm: kernel %s: %w; regenerate", k.Name, err)
		}
		if m, ok := stageMapping(sched); ok {
			g.inPlace[k] = m
		}
	}
	return g, nil
}

// layoutString names the stage slot's layout for the agreement: each
// protocol's area, in protocol order, and the scratch buffer.
func (g *gpuComm) layoutString() string {
	var b strings.Builder
	for _, p := range g.protocols {
		fmt.Fprintf(&b, "%s %d, ", p, g.area[p])
	}
	fmt.Fprintf(&b, "scratch %d", g.scratchBytes)
	return b.String()
}

// setup agrees with the other ranks on the set-up, readies the kernels of
// this world size (unless Config.LazyKernels), opens NCCL if the rules
// use it, and lays out the region every rank exported. It ends with a
// store barrier: every rank has zeroed its signal pad before any kernel
// can signal into it.
func (g *gpuComm) setup(ctx context.Context, dev device) error {
	g.dev = dev
	cfg := g.cfg
	wantNCCL := !cfg.DisableNCCL && g.usesNCCL()
	mine := gpuAgreement{Topology: g.topology, Areas: g.layoutString(), MaxBlocks: cfg.MaxBlocks,
		NCCLWindows: cfg.NCCLWindows, Process: thisProcess, WorkQueues: dev.workQueues()}
	if cfg.MaxBlocks == 0 {
		mine.SharedBlocks = sharedBlocks(g.det, dev.smCount())
	}
	switch {
	case cfg.DisableNCCL:
		mine.NCCL = "disabled by Config.DisableNCCL"
	case g.world == 1:
		mine.NCCL = "a communicator of one rank runs every collective as a copy"
	case !wantNCCL:
		mine.NCCL = "no selection rule uses it"
	case mostOnOneGPU(g.det) > 1:
		// Every rank detects the same GPUs, so every rank says so.
		mine.NCCL = "ranks share a GPU, and NCCL refuses two ranks of a communicator on one GPU"
	default:
		mine.NCCL = dev.ncclUnavailable()
	}
	all, err := gatherJSON(ctx, cfg.Store, g.prefix+"gpu", cfg.Rank, g.world, mine, "set-up record")
	if err != nil {
		return classify(fmt.Errorf("comm: rank %d: agree on GPU set-up: %w", cfg.Rank, err))
	}
	g.maxBlocks = cfg.MaxBlocks
	for r, a := range all {
		if a.Topology != mine.Topology || a.Areas != mine.Areas {
			return errorf(ErrMismatch, "comm: rank %d chose topology %q with stage areas (%s), rank %d chose %q with (%s); pass the same Config.Topology, StagingBytes and StagingBudget on every rank",
				r, a.Topology, a.Areas, cfg.Rank, mine.Topology, mine.Areas)
		}
		if a.NCCLWindows != mine.NCCLWindows {
			return errorf(ErrMismatch, "comm: rank %d passed Config.NCCLWindows %v, rank %d passed %v; pass the same value on every rank (window registration is collective)",
				r, a.NCCLWindows, cfg.Rank, mine.NCCLWindows)
		}
		if a.MaxBlocks != mine.MaxBlocks {
			return errorf(ErrMismatch, "comm: rank %d passed Config.MaxBlocks %d, rank %d passed %d; pass the same value on every rank",
				r, a.MaxBlocks, cfg.Rank, mine.MaxBlocks)
		}
		if a.SharedBlocks > 0 && (g.maxBlocks == 0 || a.SharedBlocks < g.maxBlocks) {
			g.maxBlocks = a.SharedBlocks
		}
		if a.NCCL != "" && g.ncclErr == nil {
			g.ncclErr = fmt.Errorf("NCCL is unavailable on rank %d: %s", r, a.NCCL)
		}
	}
	if g.topology != "" { // "": NCCL only, or one rank; no kernel runs
		if err := sharedQueues(g.det, all); err != nil {
			return err
		}
		// Where ranks of this process share its GPU, kernels load in New
		// even with LazyKernels: loading a kernel may synchronize the
		// context (CUDA's lazy loading), which would wait for a peer's
		// kernel waiting for this rank, until Config.Timeout.
		shared := sharesContext(g.det, cfg.Rank, all)
		// Early launch puts a kernel's blocks on the SMs, waiting, while
		// the kernel ahead of them still runs. Where ranks share this
		// context (or, under MPS, this GPU), their kernels run at once,
		// and those waiting blocks can take the SMs a peer's kernel needs
		// to be resident beside this rank's (sharedBlocks' cap counts one
		// kernel a rank): the kernels waited for each other until
		// Config.Timeout (back-to-back push collectives, goroutine ranks
		// on one H100, worlds 3, 4 and 8; case 97), so not there. Process
		// ranks on one GPU without MPS take turns on it (contexts are
		// time-sliced) and keep it: without it Abort's word did not reach
		// their kernels through one work queue (TestAbortQueuesGPU).
		g.early = !cfg.NoEarlyLaunch && dev.earlyLaunch() && !shared && !(cuda.UnderMPS() && gpuShared(g.det, cfg.Rank))
		if shared {
			g.sameContext = make([]bool, len(all))
			for r := range all {
				g.sameContext[r] = inContext(g.det, cfg.Rank, r, all)
			}
		}
		if s, ok := dev.(contextSharer); ok && shared {
			s.shareContext() // before any kernel: Close parks its frees (case 39)
		}
		if !cfg.LazyKernels || shared {
			ks, ids := g.kernels()
			if err := dev.preload(ctx, ks, ids); err != nil {
				return classify(fmt.Errorf("comm: rank %d: %w", cfg.Rank, err))
			}
		}
	}
	if g.ncclErr == nil && wantNCCL {
		if err := dev.openNCCL(ctx, ncclKey(g.prefix), cfg.Rank, g.world); err != nil {
			return classify(fmt.Errorf("comm: rank %d: %w", cfg.Rank, err))
		}
		g.ncclOK = true
	}
	if g.topology == "" {
		// NCCL only (detect.go): the GPUs cannot map each other's memory,
		// so there is no region to exchange; or one rank, which copies.
		if g.ncclOnly() && g.ncclErr != nil {
			return errorf(ErrUnsupported, "comm: rank %d: no generated kernel runs here (%s), and %v", cfg.Rank, g.det.describe(), g.ncclErr)
		}
		return classify(rendezvous.Barrier(ctx, cfg.Store, g.prefix+"ready", cfg.Rank, g.world))
	}

	sigBytes := g.signalBytes()
	scratchBytes := g.scratchBytes
	total := 2*g.slotBytes + scratchBytes + sigBytes
	seqBytes := int64(g.lib.MaxBlocks+3) * 8
	regions, seq, status, err := dev.setup(ctx, regionKey(g.prefix), total, seqBytes)
	if err != nil {
		return classify(fmt.Errorf("comm: rank %d: staging buffer of %d bytes: %w", cfg.Rank, total, err))
	}
	g.seq, g.statusPtr = seq, status
	regions = g.byCorner(regions) // kernels index peers by kernel rank
	// Areas in protocol order, the same on every rank.
	g.areaStage = map[coll.Protocol][]cuda.DevicePtr{}
	for _, base := range regions {
		off := int64(0)
		for _, proto := range g.protocols {
			g.areaStage[proto] = append(g.areaStage[proto], base+cuda.DevicePtr(off))
			off += g.area[proto]
		}
		g.scratch = append(g.scratch, base+cuda.DevicePtr(2*g.slotBytes))
		g.signal = append(g.signal, base+cuda.DevicePtr(2*g.slotBytes+scratchBytes))
	}
	if err := rendezvous.Barrier(ctx, cfg.Store, g.prefix+"ready", cfg.Rank, g.world); err != nil {
		return classify(fmt.Errorf("comm: rank %d: %w", cfg.Rank, err))
	}
	return nil
}

// kernels lists the library's kernels of this world size, in library
// order, and each one's index in the library's Kernels.
func (g *gpuComm) kernels() ([]*kernels.Kernel, []int) {
	var ks []*kernels.Kernel
	var ids []int
	for i := range g.lib.Kernels {
		if k := &g.lib.Kernels[i]; k.World == g.world {
			ks, ids = append(ks, k), append(ids, i)
		}
	}
	return ks, ids
}

// checkNamedTopology refuses a Config.Topology that names none of the
// library's GPU topologies (at any world size): a communicator of one
// rank uses none, but a misspelt name is refused there as at any world.
func (g *gpuComm) checkNamedTopology() error {
	if g.cfg.Topology == "" {
		return nil
	}
	names, kinds := gpuTopologies(g.lib, 0)
	if _, ok := kinds[g.cfg.Topology]; ok {
		return nil
	}
	return errorf(ErrInvalidArgument, "comm: topology %q is not a GPU topology of the library (have: %v)", g.cfg.Topology, names)
}

// gpuTopologies lists the library's GPU topologies that generate world
// size world (every one when world is 0), in library order, with their
// kinds.
func gpuTopologies(lib *kernels.Library, world int) ([]string, map[string]coll.TopologyKind) {
	var names []string
	kinds := map[string]coll.TopologyKind{}
	for _, s := range lib.Selections {
		if s.Kind == coll.HostSHM || (world > 0 && !slices.Contains(s.Worlds, world)) {
			continue
		}
		if _, seen := kinds[s.Topology]; !seen {
			kinds[s.Topology] = s.Kind
			names = append(names, s.Topology)
		}
	}
	return names, kinds
}

// pickTopology resolves Config.Topology and the staging size.
func (g *gpuComm) pickTopology() error {
	lib, cfg := g.lib, g.cfg
	names, kinds := gpuTopologies(lib, cfg.WorldSize)
	if len(names) == 0 {
		if cfg.Topology != "" {
			return errorf(ErrInvalidArgument, "comm: topology %q does not exist for world size %d in the library: no GPU topology generates it; add %d to a topology's world_sizes and regenerate", cfg.Topology, cfg.WorldSize, cfg.WorldSize)
		}
		// NCCL only, as for GPUs no topology of the library fits.
		if g.det == nil {
			g.det = &Detected{}
		}
		g.det.addReason(fmt.Sprintf("no GPU topology of the library generates world size %d, so every collective uses NCCL: add %d to a topology's world_sizes and regenerate", cfg.WorldSize, cfg.WorldSize))
		return nil
	}
	topo := cfg.Topology
	if topo == "" {
		topo = chooseTopology(g.det, names, kinds)
	} else if _, ok := kinds[topo]; !ok {
		return errorf(ErrInvalidArgument, "comm: topology %q does not exist for world size %d in the library (have: %v)", topo, cfg.WorldSize, names)
	} else if err := checkExplicit(g.det, topo, kinds[topo]); err != nil {
		return err
	}
	g.topology, g.kind = topo, kinds[topo]
	g.corner, g.atCorner = g.cornerOrder()
	needs := map[coll.Protocol]kernels.AreaNeed{}
	scratch := false // some rule uses a kernel that reduces into scratch
	for i := range lib.Selections {
		s := &lib.Selections[i]
		if s.Topology != topo || !slices.Contains(s.Worlds, cfg.WorldSize) {
			continue // a per-world spec has one selection per rule list
		}
		g.sels[coll.Collective(s.Collective)] = s
		if alg, unbounded := lib.UnboundedPush(s, cfg.WorldSize); unbounded && cfg.StagingBytes == 0 {
			return errorf(ErrInvalidArgument, "comm: topology %s sends unbounded %s sizes to %s, a push kernel without rounds whose inbox holds the whole message; bound the rule or set Config.StagingBytes", topo, s.Collective, alg)
		}
		for p, m := range lib.RulesSlotBounds(s, cfg.WorldSize) {
			n := needs[p]
			n.Need, n.Floor = max(n.Need, m.Need), max(n.Floor, m.Floor)
			needs[p] = n
		}
		for _, r := range s.Rules {
			if k, ok := lib.AlgorithmKernel(s.Collective, r.Use, cfg.WorldSize); ok && k.UsesScratch {
				scratch = true
			}
		}
	}
	// Each protocol's area holds what its rules need within the staging
	// budget, or StagingBytes.
	g.protocols = lib.Protocols(cfg.WorldSize)
	if cfg.StagingBytes > 0 {
		g.area = map[coll.Protocol]int64{}
		for _, p := range g.protocols {
			g.area[p] = alignUp(cfg.StagingBytes, regionAlign)
		}
		g.scratchBytes = g.area[coll.Barrier] // only barrier kernels use scratch
	} else {
		budget := cfg.StagingBudget
		if budget <= 0 {
			budget = DefaultStagingBudget
		}
		g.area, g.scratchBytes = fitAreas(g.protocols, needs, scratch, budget-g.signalBytes())
	}
	g.slotBytes = 0
	for _, p := range g.protocols {
		g.slotBytes += g.area[p]
	}
	if region := 2*g.slotBytes + g.scratchBytes + g.signalBytes(); cfg.StagingBytes == 0 && cfg.StagingBudget > 0 && region > cfg.StagingBudget {
		// The areas never shrink below their floor (the inboxes of push
		// kernels without rounds, minArea each): a budget under it cannot
		// be kept, and saying so beats a region larger than asked.
		return errorf(ErrInvalidArgument, "comm: Config.StagingBudget %d is below the %d bytes topology %s needs at world %d at least (two stage slots of %s, the signal pad); pass at least that, or 0 for the default %d",
			cfg.StagingBudget, region, topo, cfg.WorldSize, g.layoutString(), DefaultStagingBudget)
	}
	return nil
}

// DefaultStagingBudget bounds the staging region of a GPU rank (two stage
// slots, the scratch buffer and the signal pad) when Config.StagingBudget
// is 0: areas that would need more shrink (fitAreas) and their kernels run
// larger messages in more rounds.
const DefaultStagingBudget int64 = 32 << 20

// minArea is the least a protocol's area gets when the budget is cut: a
// window small enough to make rounds cost more than they save is no use.
const minArea int64 = 1 << 20

// fitAreas sizes each protocol's area of a stage slot and the scratch
// buffer: each area what the rules need (kernels.AreaNeed; minArea for a
// protocol no rule uses, room for explicitly requested calls), the scratch
// buffer the barrier area's size when a rule uses a kernel that reduces
// into it (scratch), else minArea. When the region (two slots, the scratch
// buffer) would exceed budget bytes, the areas of push kernels with rounds
// are cut first, to the largest common cap that fits, then, if that is
// not enough, the barrier area (and scratch) too: on 2 x H200 a staged
// one-shot through a 6 MiB barrier area instead of 8 MiB was 4-10% slower
// at 64-256 MiB, while a two-shot LL128 all-reduce ran 16 MiB in three
// rounds as fast as in one (docs/performance.md). No area is cut below its
// Floor (push kernels without rounds hold whole messages) or minArea, so
// floors that exceed the budget keep it exceeded; the rules that set them
// are what to bound.
func fitAreas(protos []coll.Protocol, needs map[coll.Protocol]kernels.AreaNeed, scratch bool, budget int64) (map[coll.Protocol]int64, int64) {
	size := func(pushCap, barrierCap int64) (map[coll.Protocol]int64, int64, int64) {
		areas, total, scr := map[coll.Protocol]int64{}, int64(0), int64(0)
		for _, p := range protos {
			n, limit := needs[p], barrierCap
			if p.Push() {
				limit = pushCap
			}
			want := n.Need
			if want == 0 {
				want = minArea
			}
			a := alignUp(max(n.Floor, min(want, max(limit, minArea))), regionAlign)
			areas[p], total = a, total+2*a
			if p == coll.Barrier {
				scr = a
				if !scratch {
					scr = min(a, minArea)
				}
			}
		}
		return areas, total + scr, scr
	}
	var most int64
	for _, p := range protos {
		most = max(most, needs[p].Need, minArea)
	}
	// largest finds the largest cap in [0, most] for which fits holds, to
	// regionAlign (fits(0) holds).
	largest := func(fits func(int64) bool) int64 {
		lo, hi := int64(0), most
		for hi-lo > regionAlign {
			if mid := (lo + hi) / 2; fits(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		return lo
	}
	pushCap, barrierCap := most, most
	if _, total, _ := size(most, most); total > budget {
		if _, total, _ := size(0, most); total <= budget {
			pushCap = largest(func(c int64) bool { _, t, _ := size(c, most); return t <= budget })
		} else {
			pushCap = 0
			barrierCap = largest(func(c int64) bool { _, t, _ := size(0, c); return t <= budget })
		}
	}
	areas, _, scr := size(pushCap, barrierCap)
	return areas, scr
}

// signalBytes is the size of a rank's signal pad: one 64-bit flag per
// block and rank.
func (g *gpuComm) signalBytes() int64 {
	return alignUp(int64(g.lib.MaxBlocks*g.world*8), regionAlign)
}

// usesNCCL reports whether automatic selection can send a call to NCCL:
// a rule names it, or a rule's algorithm (or one-shot, where a push
// kernel's call does not fit its inbox) lacks a kernel for some dtype and
// op of its collective, whose calls then fall back to NCCL.
func (g *gpuComm) usesNCCL() bool {
	if g.ncclOnly() {
		return true
	}
	// One rank has no selections: every call is a copy.
	for c, s := range g.sels {
		ops := coll.Ops()
		if !c.Reduces() {
			ops = []coll.Op{""}
		}
		for _, r := range s.Rules {
			algs := []coll.Algorithm{r.Use}
			if r.Use != coll.NCCL && !g.lib.Windowed(c, r.Use, g.world) { // push
				algs = append(algs, coll.OneShot)
			}
			for _, a := range algs {
				if a == coll.NCCL {
					return true
				}
				for _, dt := range coll.DTypes() {
					for _, op := range ops {
						if _, ok := g.lib.Kernel(c, a, dt, op, g.world); !ok {
							return true
						}
					}
				}
			}
		}
	}
	return false
}

// ncclOnly reports whether the group runs through NCCL alone: no
// generated kernel runs on its GPUs (detect.go). A communicator of one
// rank has no topology either, but copies.
func (g *gpuComm) ncclOnly() bool { return g.topology == "" && g.world > 1 }

func (g *gpuComm) memory() memKind { return deviceMemory }

func (g *gpuComm) rules(collective coll.Collective) *kernels.Selection { return g.sels[collective] }

// prepare plans cl.alg for the call: NCCL must be available; a generated
// algorithm needs a kernel for the call's dtype and op, and a push kernel
// room for its inbox in its protocol's area (a staged barrier kernel runs
// in rounds through any area; one reading its input in place needs none).
// The automatic choice sends a push kernel's call that does not fit to the
// one-shot barrier kernel, and a call that fails otherwise to NCCL (every
// rank decides alike: only the call's arguments, agreed set-up and whether
// the input is symmetric enter, and Alloc's contract has every rank pass
// symmetric inputs in the same calls); an explicit one is refused with
// the reason.
func (g *gpuComm) prepare(cl *call, auto bool) error {
	cl.kernel, cl.zc = nil, zeroCopy{}
	if g.world == 1 {
		// Whatever the algorithm, one rank's result is its input (a sum,
		// max or min of one operand, an all-gather of one block), bit for
		// bit, as NCCL's copy at one rank.
		cl.alg = coll.Copy
		return nil
	}
	if cl.alg == coll.NCCL {
		if g.ncclOK {
			return nil
		}
		if auto {
			return errorf(ErrUnsupported, "comm: %s of %d bytes (%s) selects nccl, but %v", cl.collective, cl.bytes, cl.dtype, g.ncclWhy())
		}
		return errorf(ErrUnsupported, "comm: %s with algorithm nccl refused: %v", cl.collective, g.ncclWhy())
	}
	if err := g.kernelRefusal(cl); err != nil {
		if auto {
			cl.alg = coll.NCCL
			return g.prepare(cl, true)
		}
		return err
	}
	if cl.alg == coll.Hierarchical {
		return errorf(ErrUnsupported, "comm: %s with algorithm hierarchical refused: it runs groups that span hosts (Config.HostID), and every rank of this one is on one host", cl.collective)
	}
	k, ok := g.lib.Kernel(cl.collective, cl.alg, cl.dtype, cl.op, g.world)
	if !ok {
		if auto { // the spec generated no kernel for this dtype/op: the rules' fallback
			cl.alg = coll.NCCL
			return g.prepare(cl, true)
		}
		return errorf(ErrUnsupported, "comm: %s with algorithm %s refused: the library has no kernel %s for %s %s at world size %d; add it to the spec and regenerate",
			cl.collective, cl.alg, cl.alg, cl.dtype, cl.op, g.world)
	}
	proto := coll.Protocol(k.Protocol)
	chunk := chunkElems(cl, g.world, k)
	need := slotNeed(k, cl.bytes, chunk*cl.esize, g.area[proto])
	zc := g.zeroCopy(k, cl)
	// Reading the input in place frees a kernel from the stage slot, but
	// not from scratch (two-shot reduces into it, laid out like the slot).
	inPlace := zc.on() && !k.UsesScratch
	window := chunk
	limit := min(g.area[proto], kernels.WindowBytes)
	scratch := g.scratchBytes
	if k.UsesScratch {
		// In message bytes: it holds elements of ScratchElemBytes.
		scratch = scratch * cl.esize / int64(k.ScratchElemBytes(cl.dtype))
		limit = min(limit, scratch) // scratch holds a window of each chunk too
	}
	if !k.Push() && !zc.on() && need > limit {
		// A staged barrier kernel runs in rounds over windows that fit the
		// area, and over windows of at most kernels.WindowBytes however
		// large the area (Config.StagingBytes): in one round the stage
		// copy and the peers' reads of a large message do not overlap.
		// On 2 x H200 a 256 MiB staged one-shot all-reduce took 946.8 us
		// in one round through a 256 MiB area, 831 us in 8 MiB windows.
		window = windowElems(limit, g.world, cl.esize, k.VecElems(int(cl.esize)))
		if window > 0 {
			need = int64(g.world) * window * cl.esize
		}
	} else if k.Push() && k.PushRounds && need > g.area[proto] {
		// A push kernel with rounds whose inbox cannot hold the message
		// runs it in rounds of equal windows that fit the area.
		window = pushWindow(g.area[proto], k, chunk, cl.esize)
		if window > 0 {
			need = k.SlotBytes(0, window*cl.esize)
		}
	}
	switch {
	case auto && need > g.area[proto] && !inPlace && k.Push() && cl.alg != coll.OneShot:
		// The push kernel's inbox cannot hold the message: one-shot runs
		// it in rounds through any staging area (NCCL if it has no kernel).
		cl.alg = coll.OneShot
		return g.prepare(cl, true)
	case auto && need > g.area[proto] && !inPlace:
		cl.alg = coll.NCCL
		return g.prepare(cl, true)
	case auto:
	case proto.Push() && need > g.area[proto]:
		needs := fmt.Sprintf("%d bytes", need)
		if chunk*cl.esize > g.area[proto] {
			needs = fmt.Sprintf("over %d bytes", g.area[proto]) // slotNeed did not multiply
		}
		return errorf(ErrInvalidArgument, "comm: %s with algorithm %s refused: %d bytes need %s of inbox (%s), more than the staging buffer's %d-byte %s area; raise Config.StagingBytes or use another algorithm",
			cl.collective, cl.alg, cl.bytes, needs, kernels.PayloadPerLine(k.Protocol), g.area[proto], proto)
	case need > scratch && zc.on() && k.UsesScratch:
		return errorf(ErrInvalidArgument, "comm: %s with algorithm %s refused: %d bytes exceed the %d-byte scratch area it reduces into (%d bytes an element there), even with its input in symmetric memory; raise Config.StagingBytes or use an algorithm without scratch (oneshot) or nccl",
			cl.collective, cl.alg, cl.bytes, g.scratchBytes, k.ScratchElemBytes(cl.dtype))
	case need > g.area[proto] && !zc.on():
		return errorf(ErrInvalidArgument, "comm: %s with algorithm %s refused: the %d-byte staging area cannot hold one %d-element vector of each of %d ranks; raise Config.StagingBytes or use nccl",
			cl.collective, cl.alg, g.area[proto], k.VecElems(int(cl.esize)), g.world)
	}
	cl.kernel, cl.chunk, cl.window, cl.zc = k, chunk, window, zc
	return nil
}

// windowElems is the round window of a staged barrier kernel (cg_window):
// the most elements per chunk, a multiple of vec, whose window of every
// one of world chunks fits area bytes; 0 when not even one vector does.
func windowElems(area int64, world int, esize, vec int64) int64 {
	return area / (int64(world) * esize) / vec * vec
}

// pushWindow is the round window of a push kernel with rounds: chunk
// split into the fewest rounds whose inbox (every place holding one window
// as the protocol's lines) fits area bytes, in windows of equal size, a
// multiple of the kernel's vector; 0 when not even one vector per place
// fits.
func pushWindow(area int64, k *kernels.Kernel, chunk, esize int64) int64 {
	line, payload := kernels.LineBytes(k.Protocol)
	vec := k.VecElems(int(esize))
	most := area / int64(max(k.InboxChunks, 1)) / line * payload / esize / vec * vec
	if most == 0 {
		return 0
	}
	rounds := (chunk + most - 1) / most
	return ((chunk+rounds-1)/rounds + vec - 1) / vec * vec
}

// slotNeed is the stage-slot bytes kernel k needs for a message of bytes
// in chunks of chunkBytes, or area+1 when that is more than area: a chunk
// larger than the area can never fit (a push kernel's inbox holds every
// chunk at least once), so the multiplication that could overflow for a
// huge count is never made.
func slotNeed(k *kernels.Kernel, bytes, chunkBytes, area int64) int64 {
	if bytes > area && (!coll.Protocol(k.Protocol).Push() || chunkBytes > area) {
		return area + 1
	}
	return k.SlotBytes(bytes, chunkBytes)
}

func (g *gpuComm) ncclWhy() error {
	if g.ncclErr != nil {
		return g.ncclErr
	}
	if g.cfg.DisableNCCL {
		return errors.New("NCCL is disabled by Config.DisableNCCL")
	}
	return errors.New("no selection rule of this topology uses NCCL, so it was not loaded")
}

// zeroCopy reports whether kernel k reads the call's input in place: the
// input lies in a symmetric buffer of this communicator's ranks and k
// fills its stage slot only by copying the input (stageMapping). Push
// kernels send from the input directly, so they never stage it.
func (g *gpuComm) zeroCopy(k *kernels.Kernel, cl *call) zeroCopy {
	if _, ok := g.inPlace[k]; !ok {
		return zeroCopy{}
	}
	return cl.sym
}

func (g *gpuComm) symmetricInput(cl *call) bool {
	cl.sym = zeroCopy{}
	if cl.in.kind == deviceMemory && !inPlaceStaged(cl, g.cfg.Rank) {
		cl.sym, _ = g.dev.lookup(cl.in.dev, cl.inBytes)
	}
	return cl.sym.on()
}

// inPlaceStaged reports in-place calls whose symmetric input must still be
// staged. An in-place all-gather's input (out + rank*inBytes) lies at a
// different offset of the buffer on every rank, where zero-copy kernels
// read every peer at this rank's offset (wrong data). An output that
// overlaps the input otherwise would be written while peers still read
// that input in place (the one-shot writes output after its first barrier
// without waiting for them): any overlap of an all-reduce or all-gather.
// An in-place reduce-scatter is safe: a rank writes only its own chunk,
// which no peer reads; any other overlap writes a chunk a peer reads.
func inPlaceStaged(cl *call, rank int) bool {
	in, out := cl.in.dev, cl.out.dev
	overlap := in < out+cuda.DevicePtr(cl.outBytes) && out < in+cuda.DevicePtr(cl.inBytes)
	if cl.collective == coll.ReduceScatter {
		return overlap && out != in+cuda.DevicePtr(int64(rank)*cl.outBytes)
	}
	return overlap
}

// run executes a prepared call; with no stream it waits for completion.
func (g *gpuComm) run(cl *call) error {
	if err := g.statusErr(); err != nil {
		return err
	}
	s := cl.o.Stream
	var err error
	switch cl.alg {
	case coll.Copy:
		if cl.in.dev != cl.out.dev {
			err = g.dev.copy(cl.out.dev, cl.in.dev, cl.outBytes, s)
		}
	case coll.NCCL:
		err = g.dev.runNCCL(cl, s)
	default:
		grid, block := gridFor(cl, g.world, g.maxBlocks)
		p := g.packers[cl.kernel]
		err = g.dev.launch(cl.kernel, int(p.id), grid, block, g.pack(p, cl), s, g.early)
	}
	if err != nil {
		return err
	}
	if s == nil {
		return g.synchronize(nil)
	}
	return nil
}

// gpuShared reports whether another rank of the group is on rank me's GPU
// (false without detection: one rank).
func gpuShared(det *Detected, me int) bool {
	return det != nil && me < len(det.BusIDs) && ranksPerGPU(det)[det.BusIDs[me]] > 1
}

// sharedBlocks is the grid cap for ranks that share a GPU (several ranks
// with one bus id in det): the SMs over the most ranks on one GPU, so the
// blocks of every rank's kernel can be resident at once, which kernels that
// wait for their peers' blocks need (any kernel's block fits on one SM).
// 0 when every rank has its own GPU.
func sharedBlocks(det *Detected, sms int) int {
	most := mostOnOneGPU(det)
	if most == 1 {
		return 0
	}
	return max(sms/most, 1)
}

// mostOnOneGPU is the most ranks of the group on one GPU (1 without
// detection: one rank).
func mostOnOneGPU(det *Detected) int {
	most := 1
	for _, n := range ranksPerGPU(det) {
		most = max(most, n)
	}
	return most
}

// ranksPerGPU counts the group's ranks on each GPU, by bus id (none
// without detection).
func ranksPerGPU(det *Detected) map[string]int {
	n := map[string]int{}
	if det != nil {
		for _, id := range det.BusIDs {
			n[id]++
		}
	}
	return n
}

// gridFor sizes a kernel launch: enough threads for one unit (vector or
// inbox unit) of every chunk each (the kernels spread a phase's chunks over
// distinct threads), at least one block, at most the spec's MaxBlocks,
// blocks of the spec's threads or, with min_threads, smaller ones while
// the grid stays within MaxBlocks (kernels.Launch.Block), and within
// maxBlocks (gpuComm.maxBlocks) unless that is 0. The kernels take any
// block of a multiple of 32 threads up to their __launch_bounds__, and any
// grid (their loops stride over it).
func gridFor(cl *call, world, maxBlocks int) (grid, block uint32) {
	k := cl.kernel
	units := int64(world) * k.ThreadUnits(cl.window, int(cl.esize)) // one round's work
	l := k.Launch
	if maxBlocks > 0 && maxBlocks < l.MaxBlocks {
		l.MaxBlocks = maxBlocks
	}
	blocks, threads := l.Block(units)
	return uint32(blocks), uint32(threads)
}

// pack fills the kernel's argument struct for a prepared call, with p its
// packer, into argBuf (valid until the next call).
func (g *gpuComm) pack(p *packer, cl *call) []byte {
	stage, slotBytes := g.areaStage[coll.Protocol(cl.kernel.Protocol)], uint64(g.slotBytes)
	if cl.zc.on() {
		// Zero-copy: peers read this input in place; the copy-in steps
		// become no-ops because source and destination coincide. One
		// slot only, so the kernel keeps its final barrier (the caller
		// may overwrite its input as soon as the kernel ends).
		slotBytes = 0
		stage = g.zcStage(cl)
	}
	return p.pack(g.argBuf, args{
		input: cl.in.dev, output: cl.out.dev, stage: stage, scratch: g.scratch, signal: g.signal,
		seq: g.seq, status: g.statusPtr, count: uint64(cl.n), chunk: uint64(cl.chunk), window: uint64(cl.window),
		timeoutNs: uint64(g.cfg.Timeout.Nanoseconds()), slotBytes: slotBytes, rank: uint64(g.kernelRank()),
	})
}

// zcStage is every kernel rank's stage pointer for a zero-copy call: its
// input copy moved back by the chunk distance its stage copies would add
// (see stageMap), so stage chunk c of kernel rank k is where that rank's
// input holds it. It fills zcBuf (valid until the next call).
func (g *gpuComm) zcStage(cl *call) []cuda.DevicePtr {
	m := g.inPlace[cl.kernel]
	stage := g.zcBuf
	for k := range stage {
		lo := min(int64(m.delta[k])*cl.chunk, cl.n) // cg_chunk's lo; delta ≥ 0 in every schedule
		stage[k] = cuda.DevicePtr(cl.zc.peers.Peer(g.rankAt(k))) + cuda.DevicePtr(cl.zc.offset) - cuda.DevicePtr(lo*cl.esize)
	}
	return stage
}

// alloc makes a symmetric buffer (Communicator.Alloc).
func (g *gpuComm) alloc(ctx context.Context, bytes int) (cuda.DevicePtr, error) {
	if g.ncclOnly() {
		return 0, errorf(ErrUnsupported, "comm: Alloc refused: the communicator uses NCCL only (%s)", g.det.Reason)
	}
	base, err := g.dev.symmetric(ctx, symmGroup(g.prefix), bytes)
	if err != nil {
		return 0, fmt.Errorf("comm: rank %d: symmetric alloc of %d bytes: %w", g.cfg.Rank, bytes, err)
	}
	return base, nil
}

// statusErr decodes the status word (see CG_STATUS_TIMEOUT in the CUDA
// header). After a timeout, barrier sequences differ between ranks, so the
// communicator stays broken: every later call returns the same error. The
// kernel reports kernel ranks; the error names communicator ranks. The
// first caller to see the timeout asks the peer what it issued
// (diagnose, up to diagnoseWait); callers meanwhile wait for its error.
func (g *gpuComm) statusErr() error {
	if err := g.broken.Load(); err != nil {
		return *err
	}
	v := g.dev.status()
	if uint32(v) == 0 {
		return nil
	}
	g.breaking.Lock()
	defer g.breaking.Unlock()
	if err := g.broken.Load(); err != nil {
		return *err
	}
	e := &TimeoutError{Rank: g.rankOf(int(v >> 8 & 0xff)), Peer: g.rankOf(int(v >> 16 & 0xff)), Barrier: int(v >> 24 & 0xff), Block: int(v >> 32 & 0xffff),
		Data: v&0xff == 2} // CG_STATUS_LL_TIMEOUT
	if id := int(v >> 48); id < len(g.lib.Kernels) {
		e.Kernel = g.lib.Kernels[id].Name
	}
	if e.Peer < len(g.sameContext) && g.sameContext[e.Peer] {
		e.Hint = fmt.Sprintf("rank %d shares this GPU's CUDA context (ranks of one process on one GPU): if it did call, a call of its that waits for the whole context while this kernel waited (cuMemFree, cuMemFreeHost, a module load or unload, cuCtxSynchronize, freeing a symmetric buffer) held it back until this deadline (docs/reliability.md, case 39)", e.Peer)
	}
	e.Calls = g.calls.diagnose(e.Peer)
	return g.setBroken(e)
}

// rankOf is the communicator rank of kernel rank k as a status word
// reports it (rankAt), k itself where it is out of range.
func (g *gpuComm) rankOf(k int) int {
	if k < 0 || k >= g.world {
		return k
	}
	return g.rankAt(k)
}

// setBroken makes err the communicator's lasting error unless one is set
// already, and returns the one that stands (the first; concurrent callers,
// such as a call and Err on another goroutine, see the same).
func (g *gpuComm) setBroken(err error) error {
	g.broken.CompareAndSwap(nil, &err)
	return *g.broken.Load()
}

// synchronize waits for s, then reports a kernel's timeout or NCCL's
// asynchronous error.
func (g *gpuComm) synchronize(s *cuda.Stream) error {
	if err := g.dev.synchronize(s); err != nil {
		if errors.Is(err, ErrTimeout) {
			// An NCCL collective past Config.Timeout (generated kernels
			// report theirs in the status word): it names no peer, so
			// every rank is asked what it issued.
			if calls := g.calls.diagnoseAll(); calls != "" {
				return errorf(ErrTimeout, "%w; %s", err, calls)
			}
		}
		return err
	}
	if err := g.statusErr(); err != nil {
		return err
	}
	return g.dev.ncclError()
}

// close is collective: ranks meet at a store barrier before the device
// frees memory a peer may still read.
func (g *gpuComm) close() error {
	free, err := g.closeOrPark()
	if free != nil {
		err = errors.Join(err, free())
	}
	return err
}

// closeOrPark is close as Communicator.Close runs it: an Abort from
// another goroutine (which stops the call book) ends the wait at the
// close barrier at once, and the device is then torn down as Abort tears
// it down, the staging region kept for peers that may still read it:
// closeOrPark returns the function that frees it (see freeWhenLeft), nil
// when the barrier passed and everything is freed.
func (g *gpuComm) closeOrPark() (freeRegion func() error, err error) {
	ctx, cancel := context.WithTimeout(g.calls.stopped, g.cfg.Timeout)
	defer cancel()
	serr := g.dev.synchronize(nil)
	berr := rendezvous.Barrier(ctx, g.cfg.Store, g.prefix+"close", g.cfg.Rank, g.world)
	if berr != nil && g.calls.stopped.Err() != nil {
		free, terr := g.teardown()
		return free, errors.Join(serr, errorf(ErrAborted, "comm: rank %d: Close: Abort ended the wait for the other ranks to close (%v); the staging region stays until they leave", g.cfg.Rank, berr), terr)
	}
	return nil, errors.Join(serr, berr, g.dev.release())
}
