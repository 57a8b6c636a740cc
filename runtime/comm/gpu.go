package comm

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/ipc"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/nccl"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/schedule"
)

// gpuComm is the GPU backend. Memory it owns, per rank:
//
//	region   one cuMemAlloc: [stage slot 0][stage slot 1][scratch]
//	         [signal pad], exported to peers through ipc (peers read stage
//	         and scratch, write inbox lines into stage, and write their
//	         arrival flags into the signal pad); consecutive collectives
//	         alternate stage slots, which lets the kernels skip their final
//	         barrier (see the CUDA header). A slot holds one area per
//	         protocol the library's kernels use at this world size
//	         (barrier, ll, ll128; see area and areaStage): a push kernel
//	         reads a line's flag words, and only lines of its own protocol
//	         are sure to hold an older flag there (a barrier kernel's staged
//	         data, or another line format, could hold any bits, the current
//	         flag included). Scratch, used by barrier kernels only, is as
//	         large as the barrier area.
//	seq      MaxBlocks barrier sequence counters plus the collective and
//	         finished-block counters and the LL abort word (local device
//	         memory)
//	status   one pinned, device-mapped word where kernels report timeouts
//	syms     symmetric buffers from Alloc, each exported like region
//
// All are zeroed before the first barrier through the store, so no peer
// ever sees a stale flag. Close waits for every rank (store barrier) before
// unmapping and freeing, because peers may still read this rank's memory.
type gpuComm struct {
	cfg    Config
	lib    *kernels.Library
	dev    *cuda.Device
	stream *cuda.Stream
	world  int

	topology   string
	sels       map[coll.Collective]*kernels.Selection // by collective
	area       map[coll.Protocol]int64                // protocol -> bytes of its area in each stage slot
	slotBytes  int64                                  // one stage slot: the sum of the areas
	maxBlocks  int
	region     cuda.DevicePtr
	regionMap  *ipc.Mapping
	areaStage  map[coll.Protocol][]cuda.DevicePtr // protocol -> by rank: its area in slot 0
	scratch    []cuda.DevicePtr
	signal     []cuda.DevicePtr
	seq        cuda.DevicePtr
	status     *cuda.HostBuffer
	cache      *cuda.Cache
	nccl       *nccl.Comm
	ncclErr    error // why NCCL cannot be used, agreed by all ranks
	kernelIDs  map[string]int
	mu         sync.Mutex // guards funcs, modules, syms, broken
	funcs      map[string]*cuda.Function
	modules    []*cuda.Module
	fatbin     *cuda.Module
	syms       []*symBuffer
	symCount   int
	broken     error
	closeOnce  sync.Once
	closeError error
}

// symBuffer is one symmetric allocation from Alloc.
type symBuffer struct {
	base  cuda.DevicePtr
	bytes int
	m     *ipc.Mapping
}

// regionAlign keeps every part of the region 256-byte aligned (LL128
// kernels need their stage slots 128-byte aligned).
const regionAlign = 256

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// agreement is what every rank publishes in New; all must match.
type agreement struct {
	Library  string `json:"library"`
	Topology string `json:"topology"`
	Staging  int64  `json:"staging"`
	World    int    `json:"world"`
	NCCL     string `json:"nccl"` // "" when this rank could load NCCL, else why not
}

func newGPU(ctx context.Context, cfg Config) (g *gpuComm, err error) {
	lib := cfg.Library
	g = &gpuComm{cfg: cfg, lib: lib, world: cfg.WorldSize, funcs: map[string]*cuda.Function{},
		sels: map[coll.Collective]*kernels.Selection{}, kernelIDs: map[string]int{}}
	for i, k := range lib.Kernels {
		g.kernelIDs[k.Name] = i
	}
	if err := g.pickTopology(); err != nil {
		return nil, err
	}
	dev, err := cuda.Open(cfg.Device)
	if err != nil {
		return nil, fmt.Errorf("comm: rank %d: %w", cfg.Rank, err)
	}
	g.dev = dev
	defer func() {
		if err != nil {
			g.release()
		}
	}()
	if g.stream, err = dev.NewStream(); err != nil {
		return nil, err
	}
	g.cache = cfg.Cache // nil: LoadSource uses the default cache if it can
	if cfg.FatbinPath != "" {
		if g.fatbin, err = dev.LoadFatbinFile(cfg.FatbinPath); err != nil {
			return nil, fmt.Errorf("comm: load fatbin %s: %w", cfg.FatbinPath, err)
		}
	}

	// Agree on everything that could differ between ranks.
	wantNCCL := !cfg.DisableNCCL && g.usesNCCL()
	mine := agreement{Library: fmt.Sprintf("%x", sha256.Sum256([]byte(lib.Manifest))), Topology: g.topology,
		Staging: g.slotBytes, World: g.world}
	var lib0 *nccl.Lib
	switch {
	case cfg.DisableNCCL:
		mine.NCCL = "disabled by Config.DisableNCCL"
	case !wantNCCL:
		mine.NCCL = "no selection rule uses it"
	default:
		if lib0, err = nccl.Load(); err != nil {
			mine.NCCL = err.Error()
		}
	}
	blob, _ := json.Marshal(mine)
	key := "collgen/comm/" + cfg.Group
	all, err := rendezvous.AllGather(ctx, cfg.Store, key+"/agree", cfg.Rank, g.world, blob)
	if err != nil {
		return nil, fmt.Errorf("comm: rank %d: agree on set-up: %w", cfg.Rank, err)
	}
	for r, b := range all {
		var a agreement
		if err := json.Unmarshal(b, &a); err != nil {
			return nil, fmt.Errorf("comm: rank %d sent a malformed set-up record: %w", r, err)
		}
		switch {
		case a.World != mine.World:
			return nil, fmt.Errorf("comm: rank %d has world size %d, rank %d has %d", r, a.World, cfg.Rank, mine.World)
		case a.Library != mine.Library:
			return nil, fmt.Errorf("comm: rank %d uses a different generated library than rank %d (manifest hash differs); build every rank from the same generated code", r, cfg.Rank)
		case a.Topology != mine.Topology || a.Staging != mine.Staging:
			return nil, fmt.Errorf("comm: rank %d chose topology %q with %d staging bytes, rank %d chose %q with %d; pass the same Config.Topology and StagingBytes on every rank",
				r, a.Topology, a.Staging, cfg.Rank, mine.Topology, mine.Staging)
		}
		if a.NCCL != "" && g.ncclErr == nil {
			g.ncclErr = fmt.Errorf("NCCL is unavailable on rank %d: %s", r, a.NCCL)
		}
	}
	if g.ncclErr == nil && wantNCCL {
		if g.nccl, err = nccl.NewComm(ctx, cfg.Store, key+"/nccl", cfg.Rank, g.world, dev); err != nil {
			return nil, fmt.Errorf("comm: rank %d: %w", cfg.Rank, err)
		}
		_ = lib0
	}

	// The registered region: stage, scratch, signal pad.
	g.maxBlocks = lib.MaxBlocks
	for _, k := range lib.Kernels {
		if k.Launch.MaxBlocks > g.maxBlocks {
			return nil, fmt.Errorf("comm: kernel %s launches %d blocks, more than the library's MaxBlocks %d; regenerate", k.Name, k.Launch.MaxBlocks, g.maxBlocks)
		}
	}
	sigBytes := alignUp(int64(g.maxBlocks*g.world*8), regionAlign)
	scratchBytes := g.area[""] // only barrier kernels use scratch
	total := 2*g.slotBytes + scratchBytes + sigBytes
	if g.region, err = dev.Alloc(int(total)); err != nil {
		return nil, fmt.Errorf("comm: rank %d: staging buffer of %d bytes: %w", cfg.Rank, total, err)
	}
	if err := dev.Memset8(g.region, 0, int(total)); err != nil {
		return nil, err
	}
	seqBytes := (g.maxBlocks + 3) * 8
	if g.seq, err = dev.Alloc(seqBytes); err != nil {
		return nil, err
	}
	if err := dev.Memset8(g.seq, 0, seqBytes); err != nil {
		return nil, err
	}
	if g.status, err = dev.HostAlloc(8, true); err != nil {
		return nil, err
	}
	if g.regionMap, err = ipc.Exchange(ctx, cfg.Store, key+"/region", cfg.Rank, g.world, dev, g.region, int(total)); err != nil {
		return nil, fmt.Errorf("comm: rank %d: %w", cfg.Rank, err)
	}
	// Areas in Library.Protocols order, the same on every rank.
	g.areaStage = map[coll.Protocol][]cuda.DevicePtr{}
	protocols := g.lib.Protocols(g.world)
	for _, p := range g.regionMap.Peers() {
		off := int64(0)
		for _, proto := range protocols {
			g.areaStage[proto] = append(g.areaStage[proto], p+cuda.DevicePtr(off))
			off += g.area[proto]
		}
		g.scratch = append(g.scratch, p+cuda.DevicePtr(2*g.slotBytes))
		g.signal = append(g.signal, p+cuda.DevicePtr(2*g.slotBytes+scratchBytes))
	}
	// Every rank has zeroed its pad before any rank can signal into it.
	if err := rendezvous.Barrier(ctx, cfg.Store, key+"/ready", cfg.Rank, g.world); err != nil {
		return nil, fmt.Errorf("comm: rank %d: %w", cfg.Rank, err)
	}
	return g, nil
}

// pickTopology resolves Config.Topology and the staging size.
func (g *gpuComm) pickTopology() error {
	lib, cfg := g.lib, g.cfg
	var names []string
	seen := map[string]bool{}
	for _, s := range lib.Selections {
		if s.Kind == coll.HostSHM || !contains(s.Worlds, cfg.WorldSize) {
			continue
		}
		if !seen[s.Topology] {
			seen[s.Topology] = true
			names = append(names, s.Topology)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("comm: no GPU topology of the library generates world size %d; add it to a topology's world_sizes and regenerate", cfg.WorldSize)
	}
	topo := cfg.Topology
	if topo == "" {
		// Prefer a fully connected NVLink topology, then spec order.
		sort.SliceStable(names, func(i, j int) bool {
			return g.kindOf(names[i]) == coll.NVLinkFull && g.kindOf(names[j]) != coll.NVLinkFull
		})
		topo = names[0]
	} else if !seen[topo] {
		return fmt.Errorf("comm: topology %q does not exist for world size %d in the library (have: %v)", topo, cfg.WorldSize, names)
	}
	g.topology = topo
	bounds := map[coll.Protocol]int64{}
	for i := range lib.Selections {
		s := &lib.Selections[i]
		if s.Topology != topo {
			continue
		}
		g.sels[s.Collective] = s
		if _, unbounded := s.MaxCustomBytes(); unbounded && cfg.StagingBytes == 0 {
			return fmt.Errorf("comm: topology %s sends unbounded %s sizes to a generated kernel; set Config.StagingBytes", topo, s.Collective)
		}
		for p, m := range lib.RulesSlotBounds(s, cfg.WorldSize) {
			bounds[p] = max(bounds[p], m)
		}
	}
	// Each protocol's area holds what its rules need, or StagingBytes.
	g.area, g.slotBytes = map[coll.Protocol]int64{}, 0
	for _, p := range lib.Protocols(cfg.WorldSize) {
		n := bounds[p]
		if cfg.StagingBytes > 0 {
			n = cfg.StagingBytes
		}
		if n == 0 {
			n = 1 << 20 // room for explicitly requested small collectives
		}
		g.area[p] = alignUp(n, regionAlign)
		g.slotBytes += g.area[p]
	}
	return nil
}

// slotNeed is the stage-slot bytes kernel k needs for call c.
func (g *gpuComm) slotNeed(k *kernels.Kernel, c call) int64 {
	size := int64(c.dtype.Size())
	return k.SlotBytes(c.n*size, g.chunkElems(k, c)*size)
}

// chunkElems is the chunk size launch passes to kernel k for call c.
func (g *gpuComm) chunkElems(k *kernels.Kernel, c call) int64 {
	return int64(schedule.ChunkElems(c.collective, int(c.n), g.world, int(k.VecElems(c.dtype.Size()))))
}

func (g *gpuComm) kindOf(topology string) coll.TopologyKind {
	for _, s := range g.lib.Selections {
		if s.Topology == topology {
			return s.Kind
		}
	}
	return ""
}

func (g *gpuComm) usesNCCL() bool {
	for _, s := range g.sels {
		for _, r := range s.Rules {
			if r.Use == NCCL {
				return true
			}
		}
	}
	return false
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// call is one collective request, normalised.
type call struct {
	collective coll.Collective
	in, out    cuda.DevicePtr
	n          int64 // elements in the full buffer (schedule convention)
	perRank    int64 // recvCount / sendCount; n for all-reduce
	dtype      coll.DType
	op         coll.Op
	o          Options
}

func (g *gpuComm) allReduce(in, out Buffer, count int, dtype, op string, o Options) error {
	return g.run(call{collective: coll.AllReduce, in: in.dev, out: out.dev, n: int64(count), perRank: int64(count), dtype: coll.DType(dtype), op: coll.Op(op), o: o})
}

func (g *gpuComm) reduceScatter(in, out Buffer, recvCount int, dtype, op string, o Options) error {
	return g.run(call{collective: coll.ReduceScatter, in: in.dev, out: out.dev, n: int64(recvCount) * int64(g.world), perRank: int64(recvCount), dtype: coll.DType(dtype), op: coll.Op(op), o: o})
}

func (g *gpuComm) allGather(in, out Buffer, sendCount int, dtype string, o Options) error {
	return g.run(call{collective: coll.AllGather, in: in.dev, out: out.dev, n: int64(sendCount) * int64(g.world), perRank: int64(sendCount), dtype: coll.DType(dtype), o: o})
}

// choose returns the algorithm for a collective of bytes (full size).
func (g *gpuComm) choose(collective coll.Collective, bytes int64, dtype coll.DType, op coll.Op) (coll.Algorithm, error) {
	sel := g.sels[collective]
	alg := coll.NCCL
	if sel != nil {
		alg = sel.Choose(bytes)
	}
	if alg != NCCL {
		if k, ok := g.lib.Kernel(collective, alg, dtype, op, g.world); !ok {
			alg = NCCL // the spec generated no kernel for this dtype/op: the rules' fallback
		} else if g.slotNeed(k, call{collective: collective, n: bytes / int64(dtype.Size()), dtype: dtype}) > g.area[k.Protocol] {
			alg = NCCL
		}
	}
	if alg == NCCL && g.nccl == nil {
		return "", fmt.Errorf("comm: %s of %d bytes (%s) selects nccl, but %v", collective, bytes, dtype, g.ncclWhy())
	}
	return alg, nil
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

func (g *gpuComm) run(c call) error {
	if err := g.statusErr(); err != nil {
		return err
	}
	if c.n < 0 || c.perRank < 0 {
		return fmt.Errorf("comm: %s: negative count", c.collective)
	}
	size := c.dtype.Size()
	if size == 0 {
		return fmt.Errorf("comm: %s: unknown dtype %q", c.collective, c.dtype)
	}
	if c.collective != coll.AllGather {
		if err := numeric.CheckOp(c.op); err != nil {
			return fmt.Errorf("comm: %s: %w", c.collective, err)
		}
	}
	if c.n == 0 {
		return nil
	}
	bytes := c.n * int64(size)
	alg := coll.Algorithm(c.o.Algorithm)
	if alg == "" {
		var err error
		if alg, err = g.choose(c.collective, bytes, c.dtype, c.op); err != nil {
			return err
		}
	} else if err := g.checkForced(c, alg, bytes); err != nil {
		return err
	}
	s := c.o.Stream
	wait := s == nil
	if wait {
		s = g.stream
	}
	var err error
	if alg == NCCL {
		err = g.runNCCL(c, s)
	} else {
		k, _ := g.lib.Kernel(c.collective, alg, c.dtype, c.op, g.world)
		err = g.launch(k, c, s)
	}
	if err != nil {
		return err
	}
	if wait {
		return g.synchronize(s)
	}
	return nil
}

// checkForced refuses an explicitly requested algorithm that cannot run,
// saying why; it never substitutes another.
func (g *gpuComm) checkForced(c call, alg coll.Algorithm, bytes int64) error {
	if alg == NCCL {
		if g.nccl == nil {
			return fmt.Errorf("comm: %s with algorithm nccl refused: %v", c.collective, g.ncclWhy())
		}
		return nil
	}
	k, ok := g.lib.Kernel(c.collective, alg, c.dtype, c.op, g.world)
	if !ok {
		return fmt.Errorf("comm: %s with algorithm %s refused: the library has no kernel %s for %s %s at world size %d; add it to the spec and regenerate",
			c.collective, alg, alg, c.dtype, c.op, g.world)
	}
	if k.Push() {
		if need := g.slotNeed(k, c); need > g.area[k.Protocol] {
			return fmt.Errorf("comm: %s with algorithm %s refused: %d bytes need %d bytes of inbox (%s), more than the staging buffer's %d-byte %s area; raise Config.StagingBytes or use another algorithm",
				c.collective, alg, bytes, need, kernels.PayloadPerLine(k.Protocol), g.area[k.Protocol], k.Protocol)
		}
	} else if bytes > g.area[k.Protocol] {
		if _, _, zc := g.zeroCopy(k, c); !zc {
			return fmt.Errorf("comm: %s with algorithm %s refused: %d bytes exceed the %d-byte staging buffer; raise Config.StagingBytes or use nccl",
				c.collective, alg, bytes, g.area[k.Protocol])
		}
	}
	return nil
}

// zeroCopy reports whether kernel k reads the call's input in place: the
// input lies in a symmetric buffer (base, mapped at peers' addresses
// peers), the collective reduces, and k pulls (push kernels send from the
// input, so a symmetric input changes nothing for them).
func (g *gpuComm) zeroCopy(k *kernels.Kernel, c call) (base cuda.DevicePtr, peers []cuda.DevicePtr, ok bool) {
	if c.collective == coll.AllGather || k.Push() {
		return 0, nil, false
	}
	return g.symFor(c.in, c.n*int64(c.dtype.Size()))
}

func (g *gpuComm) runNCCL(c call, s *cuda.Stream) error {
	dt, err := ncclType(c.dtype)
	if err != nil {
		return err
	}
	var op nccl.RedOp
	if c.collective != coll.AllGather {
		if op, err = ncclOp(c.op); err != nil {
			return err
		}
	}
	switch c.collective {
	case coll.AllReduce:
		return g.nccl.AllReduce(c.in, c.out, int(c.n), dt, op, s)
	case coll.ReduceScatter:
		return g.nccl.ReduceScatter(c.in, c.out, int(c.perRank), dt, op, s)
	default:
		return g.nccl.AllGather(c.in, c.out, int(c.perRank), dt, s)
	}
}

func ncclType(dtype coll.DType) (nccl.DataType, error) {
	switch dtype {
	case "f32":
		return nccl.Float32, nil
	case "f16":
		return nccl.Float16, nil
	case "bf16":
		return nccl.BFloat16, nil
	case "f64":
		return nccl.Float64, nil
	case "i32":
		return nccl.Int32, nil
	case "i64":
		return nccl.Int64, nil
	case "e4m3":
		return nccl.F8E4M3, nil
	case "e5m2":
		return nccl.F8E5M2, nil
	}
	return 0, fmt.Errorf("comm: NCCL has no type for %q", dtype)
}

func ncclOp(op coll.Op) (nccl.RedOp, error) {
	switch op {
	case "sum":
		return nccl.Sum, nil
	case "max":
		return nccl.Max, nil
	case "min":
		return nccl.Min, nil
	}
	return 0, fmt.Errorf("comm: NCCL has no op %q", op)
}

// function returns the loaded kernel, compiling or loading it on first use.
func (g *gpuComm) function(k *kernels.Kernel) (*cuda.Function, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f := g.funcs[k.Name]; f != nil {
		return f, nil
	}
	var m *cuda.Module
	if g.fatbin != nil {
		m = g.fatbin
	} else {
		src, err := g.lib.Source(k.Source)
		if err != nil {
			return nil, fmt.Errorf("comm: kernel %s: %w", k.Name, err)
		}
		headers, err := g.lib.Headers()
		if err != nil {
			return nil, fmt.Errorf("comm: kernel %s: %w", k.Name, err)
		}
		m, err = g.dev.LoadSource(context.Background(), cuda.CompileRequest{Name: k.Source, Source: src,
			Headers: headers, Options: []string{"--std=c++17"}}, g.cache)
		if err != nil {
			return nil, fmt.Errorf("comm: kernel %s: %w", k.Name, err)
		}
		g.modules = append(g.modules, m)
	}
	f, err := m.Function(k.Name)
	if err != nil {
		return nil, fmt.Errorf("comm: kernel %s: %w", k.Name, err)
	}
	g.funcs[k.Name] = f
	return f, nil
}

// Preload compiles or loads every kernel the library has for this world
// size, so the first collective of each kind pays no compile time.
func (g *gpuComm) preload() error {
	for i := range g.lib.Kernels {
		if k := &g.lib.Kernels[i]; k.World == g.world {
			if _, err := g.function(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// launch fills the kernel's argument struct and launches it.
func (g *gpuComm) launch(k *kernels.Kernel, c call, s *cuda.Stream) error {
	f, err := g.function(k)
	if err != nil {
		return err
	}
	size := int64(c.dtype.Size())
	chunk := g.chunkElems(k, c)
	stage, slotBytes := g.areaStage[k.Protocol], uint64(g.slotBytes)
	if base, peers, ok := g.zeroCopy(k, c); ok {
		// Zero-copy: peers read this input in place; the copy-in steps
		// become no-ops because source and destination coincide. One
		// slot only, so the kernel keeps its final barrier (the caller
		// may overwrite its input as soon as the kernel ends).
		off := c.in - base
		slotBytes = 0
		stage = make([]cuda.DevicePtr, g.world)
		for r, p := range peers {
			stage[r] = p + off
		}
	} else if need := k.SlotBytes(c.n*size, chunk*size); need > g.area[k.Protocol] {
		return fmt.Errorf("comm: %s: needs %d bytes of stage slot, the staging buffer's area for it has %d", k.Name, need, g.area[k.Protocol])
	}
	l := k.Args
	a := make([]byte, l.Size)
	put := func(name string, i int, v uint64) {
		f := l.Field(name)
		o := f.Offset + i*f.Size
		if f.Size == 4 {
			binary.LittleEndian.PutUint32(a[o:], uint32(v))
		} else {
			binary.LittleEndian.PutUint64(a[o:], v)
		}
	}
	put("input", 0, uint64(c.in))
	put("output", 0, uint64(c.out))
	for r := 0; r < g.world; r++ {
		put("stage", r, uint64(stage[r]))
		put("scratch", r, uint64(g.scratch[r]))
		put("signal", r, uint64(g.signal[r]))
	}
	put("seq", 0, uint64(g.seq))
	put("status", 0, uint64(g.status.DevPtr))
	put("count", 0, uint64(c.n))
	put("chunk", 0, uint64(chunk))
	put("timeout_ns", 0, uint64(g.cfg.Timeout.Nanoseconds()))
	put("slot_bytes", 0, slotBytes)
	put("rank", 0, uint64(g.cfg.Rank))
	put("kernel_id", 0, uint64(g.kernelIDs[k.Name]))
	// Enough threads for one unit (vector or inbox unit) of every chunk
	// each (the kernels spread a phase's chunks over distinct threads),
	// capped by the spec.
	threads := int64(k.Launch.Threads)
	units := int64(g.world) * k.ThreadUnits(chunk, int(size))
	blocks := (units + threads - 1) / threads
	if blocks < 1 {
		blocks = 1
	}
	if blocks > int64(k.Launch.MaxBlocks) {
		blocks = int64(k.Launch.MaxBlocks)
	}
	return f.Launch([3]uint32{uint32(blocks), 1, 1}, [3]uint32{uint32(threads), 1, 1}, 0, s, a)
}

// symFor finds the symmetric buffer holding [p, p+bytes).
func (g *gpuComm) symFor(p cuda.DevicePtr, bytes int64) (base cuda.DevicePtr, peers []cuda.DevicePtr, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, sb := range g.syms {
		if p >= sb.base && int64(p-sb.base)+bytes <= int64(sb.bytes) {
			return sb.base, sb.m.Peers(), true
		}
	}
	return 0, nil, false
}

func (g *gpuComm) alloc(ctx context.Context, bytes int) (cuda.DevicePtr, error) {
	p, err := g.dev.Alloc(bytes)
	if err != nil {
		return 0, err
	}
	g.mu.Lock()
	g.symCount++
	n := g.symCount
	g.mu.Unlock()
	m, err := ipc.Exchange(ctx, g.cfg.Store, fmt.Sprintf("collgen/comm/%s/sym%d", g.cfg.Group, n), g.cfg.Rank, g.world, g.dev, p, bytes)
	if err != nil {
		g.dev.Free(p)
		return 0, fmt.Errorf("comm: symmetric alloc %d: %w", n, err)
	}
	g.mu.Lock()
	g.syms = append(g.syms, &symBuffer{base: p, bytes: bytes, m: m})
	g.mu.Unlock()
	return p, nil
}

// TimeoutError is a kernel's report that a rank waited too long for a peer.
type TimeoutError struct {
	Kernel  string // the kernel that timed out
	Rank    int    // the rank that waited
	Peer    int    // the rank it waited for
	Barrier int    // which barrier of the kernel; for Data, the phase
	Block   int
	// Data: an LL kernel waited for the peer's data (there are no barriers).
	Data bool
}

func (e *TimeoutError) Error() string {
	at := fmt.Sprintf("at barrier %d", e.Barrier)
	if e.Data {
		at = fmt.Sprintf("for its data in phase %d", e.Barrier)
	}
	return fmt.Sprintf("comm: %s timed out: rank %d waited for rank %d %s (block %d); the peer is dead, stalled or issuing a different collective",
		e.Kernel, e.Rank, e.Peer, at, e.Block)
}

// statusErr decodes the status word (see CG_STATUS_TIMEOUT in the CUDA
// header). After a timeout, barrier sequences differ between ranks, so the
// communicator stays broken: every later call returns the same error.
func (g *gpuComm) statusErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.broken != nil {
		return g.broken
	}
	if g.status == nil {
		return nil
	}
	lo := g.status.LoadUint32(0)
	if lo == 0 {
		return nil
	}
	hi := g.status.LoadUint32(4)
	v := uint64(hi)<<32 | uint64(lo)
	e := &TimeoutError{Rank: int(v >> 8 & 0xff), Peer: int(v >> 16 & 0xff), Barrier: int(v >> 24 & 0xff), Block: int(v >> 32 & 0xffff),
		Data: v&0xff == 2} // CG_STATUS_LL_TIMEOUT
	if id := int(v >> 48); id < len(g.lib.Kernels) {
		e.Kernel = g.lib.Kernels[id].Name
	}
	g.broken = e
	return e
}

func (g *gpuComm) synchronize(s *cuda.Stream) error {
	if s == nil {
		s = g.stream
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	if err := g.statusErr(); err != nil {
		return err
	}
	if g.nccl != nil {
		return g.nccl.AsyncError()
	}
	return nil
}

func (g *gpuComm) close() error {
	g.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Timeout)
		defer cancel()
		if g.stream != nil {
			g.stream.Synchronize()
		}
		// Peers may still read our memory until they are done too.
		err := rendezvous.Barrier(ctx, g.cfg.Store, "collgen/comm/"+g.cfg.Group+"/close", g.cfg.Rank, g.world)
		rerr := g.release()
		g.closeError = errors.Join(err, rerr)
	})
	return g.closeError
}

// release frees what this rank owns, in reverse order of creation.
func (g *gpuComm) release() error {
	var errs []error
	if g.nccl != nil {
		errs = append(errs, g.nccl.Destroy())
		g.nccl = nil
	}
	for _, sb := range g.syms {
		errs = append(errs, sb.m.Close(), g.dev.Free(sb.base))
	}
	g.syms = nil
	if g.regionMap != nil {
		errs = append(errs, g.regionMap.Close())
		g.regionMap = nil
	}
	if g.dev != nil {
		for _, p := range []*cuda.DevicePtr{&g.region, &g.seq} {
			if *p != 0 {
				errs = append(errs, g.dev.Free(*p))
				*p = 0
			}
		}
	}
	if g.status != nil {
		errs = append(errs, g.status.Free())
	}
	for _, m := range g.modules {
		errs = append(errs, m.Unload())
	}
	if g.fatbin != nil {
		errs = append(errs, g.fatbin.Unload())
	}
	if g.stream != nil {
		errs = append(errs, g.stream.Destroy())
		g.stream = nil
	}
	if g.dev != nil {
		errs = append(errs, g.dev.Close())
	}
	return errors.Join(errs...)
}
