// Package kernels holds the types that a generated collectives package fills
// in and the runtime reads: the kernel registry, argument layouts, selection
// rules, the embedded CUDA sources and the host reduce loops. It has no logic
// beyond lookups, so generated code and the runtime agree on one vocabulary.
package kernels

import (
	"fmt"
	"io/fs"
	"slices"
	"sync"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/schedule"
)

// Versions of the contract between generated packages and this package,
// enforced at compile time as protobuf-go's protoimpl.EnforceVersion does:
// every generated kernels.go declares
//
//	const (
//		_ = kernels.EnforceVersion(GEN - kernels.MinVersion)
//		_ = kernels.EnforceVersion(kernels.MaxVersion - GEN)
//	)
//
// with GEN the GenVersion of the collgen that generated it. A package too
// old for this runtime (GEN < MinVersion), or a runtime too old for the
// package (GEN > MaxVersion), does not compile ("constant -1 overflows
// kernels.EnforceVersion"): regenerate it with this collgen.
const (
	// GenVersion is the version collgen's generator emits. Bump it, and
	// MaxVersion, whenever generated code needs something new of this
	// package; raise MinVersion when this package stops reading what older
	// generated code provides.
	GenVersion = 3
	// MinVersion is the oldest generated code this package reads.
	MinVersion = 1
	// MaxVersion is the newest generated code this package reads.
	MaxVersion = GenVersion
)

// EnforceVersion is the type of generated code's version checks: a
// negative constant converted to it does not compile.
type EnforceVersion uint

// Launch is a kernel's launch configuration from the spec.
type Launch struct {
	Threads     int // threads per block
	MaxBlocks   int // the most blocks one launch uses
	VectorBytes int // width of one vector load; 16 means 128-bit loads
	// MinThreads, if not 0, is the smallest block a launch may use (see
	// Block): below MaxBlocks blocks of Threads, blocks shrink towards it.
	MinThreads int
}

// Block sizes a launch of units threads' worth of work (one unit per
// thread): blocks of Threads threads, unless MinThreads allows smaller
// ones, which the launch uses while that keeps the grid within MaxBlocks
// (multiples of 32, at least MinThreads), so the work spreads over more
// SMs. It returns the grid and block sizes; at least one block.
func (l Launch) Block(units int64) (blocks, threads int64) {
	threads = int64(l.Threads)
	if l.MinThreads > 0 && l.MinThreads < l.Threads {
		per := (units + int64(l.MaxBlocks) - 1) / int64(l.MaxBlocks) // threads per block to fill MaxBlocks
		per = (per + 31) / 32 * 32
		threads = min(max(per, int64(l.MinThreads)), threads)
	}
	blocks = min(max((units+threads-1)/threads, 1), int64(l.MaxBlocks))
	return blocks, threads
}

// Field is one member of a kernel's by-value argument struct.
type Field struct {
	Name   string // C and Go member name
	Offset int    // byte offset in the struct
	Size   int    // bytes of one element
	Count  int    // array length, 1 for scalars
}

// ArgLayout is the C layout of the single struct a kernel takes by value. The
// generated CUDA source static_asserts the same offsets, and the generated Go
// test checks its mirror struct against them.
type ArgLayout struct {
	CType  string  // C struct name, e.g. collgen_args_w4
	Size   int     // sizeof, a multiple of 8
	Fields []Field // its members
}

// Field returns the named field or panics: layouts are generated, so a
// missing name is a programming error.
func (l *ArgLayout) Field(name string) Field {
	f, ok := l.Lookup(name)
	if !ok {
		panic(fmt.Sprintf("kernels: %s has no field %q", l.CType, name))
	}
	return f
}

// Lookup returns the named field, and false when l has none (a layout
// generated before the field existed).
func (l *ArgLayout) Lookup(name string) (Field, bool) {
	for _, f := range l.Fields {
		if f.Name == name {
			return f, true
		}
	}
	return Field{}, false
}

// Kernel describes one generated, fully specialised CUDA kernel.
type Kernel struct {
	Name       string          // readable and stable: allreduce_oneshot_bf16_sum_w4; Symbol names the function that runs it
	Collective coll.Collective // the collective it runs
	Algorithm  coll.Algorithm  // a generated one
	DType      coll.DType      // element type
	Op         coll.Op         // empty for all-gather
	World      int             // the world size it is specialised for
	Launch     Launch          // launch parameters from the spec
	Args       *ArgLayout      // the argument struct it takes by value
	Source     string          // file name of its .cu in Library.Sources
	// Symbol is the extern "C" function in Source that runs the kernel.
	// Kernels whose code is the same share a Source and Symbol (the ops
	// of one reducing kernel, the dtypes of one element size of a copying
	// one: plan.Program); such a function takes the op from the argument
	// struct's `op` member (OpCode). Empty in packages generated before
	// GenVersion 2, where it is Name.
	Symbol      string
	Barriers    int  // barriers per launch (each bumps the per-block sequence)
	UsesScratch bool // needs the symmetric scratch buffer
	// ScratchAcc: the scratch holds partial sums in the accumulator type
	// (f32 for 2-byte floats; schedule.Schedule.AccScratch), so an element
	// takes ScratchElemBytes there.
	ScratchAcc bool
	// Protocol is coll.Barrier for pull kernels, coll.LL or coll.LL128 for
	// push kernels that write into peers' inboxes with a flag in every line.
	Protocol coll.Protocol
	// InboxChunks is, for push kernels, how many chunk-sized inbox areas
	// one stage slot holds (W lanes of W chunks); see InboxChunkBytes.
	InboxChunks int
	// PushRounds: a push kernel that runs a message its inbox cannot hold
	// in rounds, its inbox holding one window of each place
	// (schedule.RoundsSafe: every put is ordered after the reads it
	// overwrites). False for push kernels that run in one round only, and
	// in packages generated before GenVersion 3. Barrier kernels always
	// run in rounds.
	PushRounds bool
}

// Rounds reports whether the kernel runs a message its stage slot cannot
// hold in rounds (cg_window): barrier kernels, and push kernels with
// PushRounds.
func (k *Kernel) Rounds() bool { return !k.Push() || k.PushRounds }

// AlignedRounds reports whether a push kernel's rounds change its work
// split (schedule.Aligned): the reduce-scatter's and all-gather's
// one-shots, which schedule.RoundsSplit lets run in rounds only when one
// thread handles unit u of every chunk, where in one round the chunks run
// on distinct threads. Such a kernel keeps the sizes its bounded rules give
// it in one round (RulesSlotBounds). Derived, as RoundsSplit decides it:
// every push kernel with rounds but the all-reduce's.
func (k *Kernel) AlignedRounds() bool {
	return k.Push() && k.PushRounds && k.Collective != coll.AllReduce
}

// Func is the name of the function that runs k: Symbol, or Name for a
// package generated before kernels had symbols of their own.
func (k *Kernel) Func() string {
	if k.Symbol != "" {
		return k.Symbol
	}
	return k.Name
}

// OpCode is the value of a reduce op in a kernel's `op` argument and in
// the device header's CG_OP_* constants (its index in coll.Ops), or -1 for
// an op coll does not know. The header is generated from the same list,
// so the two cannot disagree.
func OpCode(op coll.Op) int { return slices.Index(coll.Ops(), op) }

// VecElems is how many elements of elemSize bytes one of the kernel's
// vectors holds (at least 1): the unit chunks are rounded to.
func (k *Kernel) VecElems(elemSize int) int64 {
	if v := k.Launch.VectorBytes / elemSize; v > 1 {
		return int64(v)
	}
	return 1
}

// Push reports whether the kernel writes into peers' inboxes (an LL,
// LL128 or Lamport kernel): it never reads its input in place from a peer, and its
// stage-slot need is its inbox.
func (k *Kernel) Push() bool { return k.Protocol.Push() }

// InboxChunkBytes is the inbox footprint of a chunk of chunkBytes payload
// bytes under a push protocol: one 16-byte LL line per 8 payload bytes,
// one 128-byte LL128 line per 120 payload bytes (always a multiple of 128,
// so every LL128 line stays 128-byte aligned), or one 16-byte Lamport line
// per 16.
func InboxChunkBytes(protocol coll.Protocol, chunkBytes int64) int64 {
	line, payload := LineBytes(protocol)
	return (chunkBytes + payload - 1) / payload * line
}

// LineBytes is a push protocol's line: its bytes in the inbox and the
// payload bytes it carries (LL 16 and 8, LL128 128 and 120, Lamport 16
// and 16).
func LineBytes(protocol coll.Protocol) (line, payload int64) {
	switch protocol {
	case coll.LL128:
		return 128, 120
	case coll.Lamport:
		return 16, 16
	}
	return 16, 8
}

// PayloadPerLine describes a push protocol's line for error messages.
func PayloadPerLine(protocol coll.Protocol) string {
	switch protocol {
	case coll.LL128:
		return "LL128 lines carry 120 payload bytes in 128"
	case coll.Lamport:
		return "Lamport lines carry 16 payload bytes in 16"
	}
	return "LL lines carry 8 payload bytes in 16"
}

// ThreadUnits is how many units of work one chunk of chunkElems elements
// gives the kernel's threads, rounded up to a whole warp (32), since the
// work split starts every chunk on a warp boundary (cg_shift and
// cg_push_shift in the device runtime): vectors for barrier kernels,
// 16-byte inbox units for push kernels (an LL or Lamport line, or one
// eighth of an LL128 line). Launches size their grid from it.
func (k *Kernel) ThreadUnits(chunkElems int64, elemSize int) int64 {
	if k.Push() {
		return (InboxChunkBytes(k.Protocol, chunkElems*int64(elemSize))/16 + 31) &^ 31
	}
	vec := k.VecElems(elemSize)
	return ((chunkElems+vec-1)/vec + 31) &^ 31
}

// WindowBytes is the most stage-slot bytes the rules make a kernel that
// runs in rounds (Kernel.Rounds) need: a larger message runs in rounds over
// windows of every chunk that fit the slot (cg_window in the CUDA header;
// the runtime picks the window), so the staging buffer does not grow with
// the message and a rule may send unbounded sizes to such a kernel. The
// inbox of a push kernel without rounds holds whole chunks.
const WindowBytes int64 = 8 << 20

// SlotBytes returns how many bytes of a stage slot the kernel needs to run
// a collective whose buffer holds fullBytes split in chunks of chunkBytes
// in one round: the whole buffer for barrier kernels, the inbox for push
// kernels.
func (k *Kernel) SlotBytes(fullBytes, chunkBytes int64) int64 {
	if k.Push() {
		return int64(k.InboxChunks) * InboxChunkBytes(k.Protocol, chunkBytes)
	}
	return fullBytes
}

// Rule maps sizes up to UpTo bytes (0: no bound) to a generated algorithm
// or coll.NCCL.
type Rule struct {
	UpTo int64          // inclusive bound in bytes; 0: no bound
	Use  coll.Algorithm // a generated algorithm, or coll.NCCL
	// Symmetric: only for calls whose input lies in symmetric memory (see
	// spec.Rule); Choose skips it for others.
	Symmetric bool
}

// Selection is a topology's ordered size rules for one collective.
type Selection struct {
	Topology   string            // topology name from the spec
	Kind       coll.TopologyKind // the topology's kind
	Collective coll.Collective   // the collective the rules choose for
	Worlds     []int             // world sizes these rules are for: all of the topology's, or those sharing a per-world rule list
	Rules      []Rule            // in order: the first that covers a size wins (Choose)
}

// Choose returns the algorithm the rules pick for a message of the given
// size in bytes whose input is in symmetric memory or not, or coll.NCCL
// when no rule covers it.
func (s *Selection) Choose(bytes int64, symmetric bool) coll.Algorithm {
	for _, r := range s.Rules {
		if r.Symmetric && !symmetric {
			continue
		}
		if r.UpTo == 0 || bytes <= r.UpTo {
			return r.Use
		}
	}
	return coll.NCCL
}

// HostReduceFunc combines srcs elementwise into dst, in source order:
// dst[i] = srcs[0][i] op srcs[1][i] op ... . len(dst) is a multiple of the
// element size and every source is at least as long. dst may alias any
// source. f16 and bf16 accumulate in f32 and round once.
type HostReduceFunc func(dst []byte, srcs [][]byte)

// HostKey names a host reduce loop.
type HostKey struct {
	DType coll.DType // element type
	Op    coll.Op    // reduce op
}

// Library is everything a generated package provides to the runtime.
type Library struct {
	Package    string      // the generated package's name (the spec's package)
	Kernels    []Kernel    // every generated kernel
	Selections []Selection // the size rules: one per topology, collective and distinct rule list
	// MultiHost are the size rules of groups spanning hosts (the spec's
	// multi_host.select), one Selection per collective that has rules,
	// with Topology "multi_host" and no Kind or Worlds: each rule uses
	// coll.Hierarchical or coll.NCCL. comm.Config.MultiHostRules, when
	// set, replaces them.
	MultiHost []Selection
	// Sources holds, at its root, every kernel's .cu file (Kernel.Source)
	// and the headers they include (*.cuh): the generated package embeds
	// the files of its cuda directory, so each source exists once.
	Sources fs.FS
	// HostReducers are the generated host reduce loops, per dtype and op.
	HostReducers map[HostKey]HostReduceFunc
	Manifest     string // content hashes of the specs and templates that made it
	// index maps kernel attributes to Kernels' entries, built on the first
	// lookup (Kernels must not change after it): Kernel runs on every
	// collective, and a scan of hundreds of kernels costs microseconds.
	indexOnce sync.Once
	index     map[kernelKey]*Kernel
	// MaxBlocks is the CUDA header's CG_MAX_BLOCKS: signal pads hold this
	// many blocks per rank, and the sequence array MaxBlocks + 3 words.
	MaxBlocks int
}

// SlotBound is the stage-slot bytes an algorithm needs at a world size for
// a collective of up to bytes (the full buffer) in one round, over the
// dtypes it has kernels for: for barrier kernels bytes itself, for push
// kernels the inbox, and at most WindowBytes for kernels that run larger
// messages in rounds (Windowed). Chunks are schedule.ChunkElems's, counted
// in bytes (vectors of VectorBytes), an upper bound for every element size.
func (l *Library) SlotBound(collective coll.Collective, algorithm coll.Algorithm, world int, bytes int64) int64 {
	// A rule's upto can be any int64 the spec takes; the inbox arithmetic
	// below overflowed from 2^62 (a rule of 1<<62 needed 0 bytes, so its
	// push kernel never ran). No slot holds more than slotBoundCap, and the
	// staging budget caps an area long before that.
	bytes = min(bytes, slotBoundCap)
	var need int64
	for i := range l.Kernels {
		k := &l.Kernels[i]
		if k.Collective != collective || k.Algorithm != algorithm || k.World != world {
			continue
		}
		chunk := int64(schedule.ChunkElems(collective, int(bytes), world, k.Launch.VectorBytes))
		need = max(need, k.SlotBytes(bytes, chunk))
	}
	if l.Windowed(collective, algorithm, world) {
		need = min(need, WindowBytes)
	}
	return need
}

// slotBoundCap is the largest message SlotBound sizes a slot for: 1 TiB,
// beyond any GPU's memory, and small enough that a push protocol's inbox
// of it (twice the bytes at most) stays far below 2^63.
const slotBoundCap = 1 << 40

// AlgorithmKernel is an algorithm's first kernel at a world size (all of
// them share a schedule, so its protocol and rounds); ok is false when it
// has none.
func (l *Library) AlgorithmKernel(collective coll.Collective, algorithm coll.Algorithm, world int) (k *Kernel, ok bool) {
	for i := range l.Kernels {
		if k := &l.Kernels[i]; k.Collective == collective && k.Algorithm == algorithm && k.World == world {
			return k, true
		}
	}
	return nil, false
}

// AreaNeed is what one protocol's area of a stage slot must hold for the
// rules at a world size: Need runs the largest message the rules send to
// kernels of that protocol in one round (at most WindowBytes for kernels
// that run in rounds); Floor is the part rounds cannot shrink, the inbox
// of the largest message a rule sends to a push kernel without rounds, or
// a bounded rule to one whose rounds change its split (AlignedRounds).
type AreaNeed struct {
	Need, Floor int64 // bytes; see AreaNeed
}

// RulesSlotBounds is, per protocol (Kernel.Protocol), what the rules of a
// selection need of a stage slot at a world size (NCCL rules, symmetric
// rules, whose inputs are read in place, and algorithms without kernels at
// this world count for nothing). An unbounded rule counts WindowBytes for
// an algorithm that runs in rounds and nothing for a push one without
// (UnboundedPush finds those).
func (l *Library) RulesSlotBounds(s *Selection, world int) map[coll.Protocol]AreaNeed {
	bounds := map[coll.Protocol]AreaNeed{}
	for _, r := range s.Rules {
		if r.Use == coll.NCCL || r.Symmetric { // symmetric inputs need no staging
			continue
		}
		k, ok := l.AlgorithmKernel(s.Collective, r.Use, world)
		if !ok || (r.UpTo == 0 && !k.Rounds()) {
			continue
		}
		upTo := r.UpTo
		if upTo == 0 {
			upTo = WindowBytes // what a kernel that runs in rounds needs at most
		}
		need := l.SlotBound(s.Collective, r.Use, world, upTo)
		b := bounds[k.Protocol]
		b.Need = max(b.Need, need)
		if !k.Rounds() || r.UpTo != 0 && k.AlignedRounds() {
			b.Floor = max(b.Floor, need)
		}
		bounds[k.Protocol] = b
	}
	return bounds
}

// Windowed reports whether an algorithm's kernels at a world size run a
// message of any size through a staging area too small for it in rounds
// (Kernel.Rounds: barrier kernels, and push kernels with PushRounds);
// false for other push kernels and for an algorithm without kernels there.
func (l *Library) Windowed(collective coll.Collective, algorithm coll.Algorithm, world int) bool {
	k, ok := l.AlgorithmKernel(collective, algorithm, world)
	return ok && k.Rounds()
}

// UnboundedPush returns the push algorithm without rounds that a rule of
// the selection sends unbounded sizes to at a world size, if any: its inbox
// would have to hold the largest message, so only an explicit staging size
// can bound it. Kernels with rounds take any size (WindowBytes).
func (l *Library) UnboundedPush(s *Selection, world int) (coll.Algorithm, bool) {
	for _, r := range s.Rules {
		if r.Use == coll.NCCL || r.Symmetric || r.UpTo != 0 {
			continue
		}
		if k, ok := l.AlgorithmKernel(s.Collective, r.Use, world); ok && !k.Rounds() {
			return r.Use, true
		}
	}
	return "", false
}

// Protocols lists, sorted, the protocols of the library's kernels at a
// world size (coll.Barrier, "", first).
func (l *Library) Protocols(world int) []coll.Protocol {
	seen := map[coll.Protocol]bool{}
	var out []coll.Protocol
	for i := range l.Kernels {
		if p := l.Kernels[i].Protocol; l.Kernels[i].World == world && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// kernelKey is Library.index's key: a kernel's identifying attributes.
type kernelKey struct {
	collective coll.Collective
	algorithm  coll.Algorithm
	dtype      coll.DType
	op         coll.Op
	world      int
}

// Kernel returns the kernel with the given attributes.
func (l *Library) Kernel(collective coll.Collective, algorithm coll.Algorithm, dtype coll.DType, op coll.Op, world int) (*Kernel, bool) {
	l.indexOnce.Do(func() {
		l.index = make(map[kernelKey]*Kernel, len(l.Kernels))
		for i := range l.Kernels {
			k := &l.Kernels[i]
			l.index[kernelKey{k.Collective, k.Algorithm, k.DType, k.Op, k.World}] = k
		}
	})
	k, ok := l.index[kernelKey{collective, algorithm, dtype, op, world}]
	return k, ok
}

// Selection returns the rules of a topology kind for a collective at a world
// size, preferring the first matching topology in spec order.
func (l *Library) Selection(kind coll.TopologyKind, collective coll.Collective, world int) (*Selection, bool) {
	for i := range l.Selections {
		s := &l.Selections[i]
		if s.Kind != kind || s.Collective != collective {
			continue
		}
		for _, w := range s.Worlds {
			if w == world {
				return s, true
			}
		}
	}
	return nil, false
}

// Source returns the CUDA source of a file in Sources, such as a kernel's
// Kernel.Source.
func (l *Library) Source(name string) (string, error) {
	if l.Sources == nil {
		return "", fmt.Errorf("kernels: library %s has no CUDA sources", l.Package)
	}
	b, err := fs.ReadFile(l.Sources, name)
	if err != nil {
		return "", fmt.Errorf("kernels: library %s: %w", l.Package, err)
	}
	return string(b), nil
}

// Headers returns every header in Sources (*.cuh) by file name: what
// NVRTC needs to resolve the kernels' includes.
func (l *Library) Headers() (map[string]string, error) {
	if l.Sources == nil {
		return nil, fmt.Errorf("kernels: library %s has no CUDA sources", l.Package)
	}
	names, err := fs.Glob(l.Sources, "*.cuh")
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(names))
	for _, n := range names {
		if out[n], err = l.Source(n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// HostReducer returns the host reduce loop for a dtype and op.
func (l *Library) HostReducer(dtype coll.DType, op coll.Op) (HostReduceFunc, bool) {
	f, ok := l.HostReducers[HostKey{dtype, op}]
	return f, ok
}

// ScratchElemBytes is the bytes one element of dt takes in the kernel's
// scratch: dt's size, or 4 where the scratch holds f32 accumulators of an
// f16 or bf16 (ScratchAcc and coll.DType.WideAccumulator; the other types
// accumulate in their own type).
func (k *Kernel) ScratchElemBytes(dt coll.DType) int {
	if k.ScratchAcc && dt.WideAccumulator() {
		return 4
	}
	return dt.Size()
}
