package schedule

import (
	"fmt"
	"slices"

	"github.com/collgen/collgen/coll"
)

// builders maps collective -> algorithm -> schedule builder.
var builders = map[coll.Collective]map[coll.Algorithm]func(w int) (*Schedule, error){
	coll.AllReduce: {
		coll.OneShot:        allReduceOneShot,
		coll.TwoShot:        allReduceTwoShot,
		coll.HCM:            allReduceHCM,
		coll.OneShotLL:      allReduceOneShotLL,
		coll.TwoShotLL:      allReduceTwoShotLL,
		coll.OneShotLL128:   twin(coll.OneShotLL128, allReduceOneShotLL),
		coll.TwoShotLL128:   twin(coll.TwoShotLL128, allReduceTwoShotLL),
		coll.OneShotLamport: twin(coll.OneShotLamport, allReduceOneShotLL),
		coll.TwoShotLamport: twin(coll.TwoShotLamport, allReduceTwoShotLL),
	},
	coll.ReduceScatter: {
		coll.OneShot:        reduceScatterOneShot,
		coll.OneShotLL:      reduceScatterOneShotLL,
		coll.OneShotLL128:   twin(coll.OneShotLL128, reduceScatterOneShotLL),
		coll.OneShotLamport: twin(coll.OneShotLamport, reduceScatterOneShotLL),
	},
	coll.AllGather: {
		coll.OneShot:      allGatherOneShot,
		coll.OneShotLL:    allGatherOneShotLL,
		coll.OneShotLL128: twin(coll.OneShotLL128, allGatherOneShotLL),
	},
}

// twin turns an LL schedule builder into its twin under another push
// protocol (coll.LL128, coll.Lamport: the algorithm name's): the same
// steps, another name. The all-gather has no Lamport twin: it copies bits
// exactly, and Lamport sends the all-ones NaN as another NaN.
func twin(name coll.Algorithm, build func(w int) (*Schedule, error)) func(w int) (*Schedule, error) {
	return func(w int) (*Schedule, error) {
		s, err := build(w)
		if err != nil {
			return nil, err
		}
		s.Algorithm, s.Protocol = name, name.Protocol()
		return s, nil
	}
}

// Algorithms returns the algorithm names known for a collective, sorted; nil
// for an unknown collective.
func Algorithms(collective coll.Collective) []coll.Algorithm {
	var names []coll.Algorithm
	for name := range builders[collective] {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// KindWorldSizes returns the world sizes a topology kind can have: either the
// range [min, max], or, when only is non-nil, exactly the listed sizes.
func KindWorldSizes(kind coll.TopologyKind) (min, max int, only []int) {
	switch kind {
	case coll.NVLinkFull, coll.PCIeP2P:
		return 2, 8, nil
	case coll.HybridCubeMesh:
		return 8, 8, []int{8}
	case coll.HostSHM:
		return 1, 64, nil
	}
	return 0, 0, nil
}

// Build returns the schedule of an algorithm for a collective over world
// ranks, or an error saying why it does not exist.
func Build(collective coll.Collective, algorithm coll.Algorithm, world int) (*Schedule, error) {
	algs, ok := builders[collective]
	if !ok {
		return nil, fmt.Errorf("unknown collective %q (known: %v)", collective, coll.Collectives())
	}
	b, ok := algs[algorithm]
	if !ok {
		return nil, fmt.Errorf("unknown %s algorithm %q (known: %v)", collective, algorithm, Algorithms(collective))
	}
	if world < 1 || world > 64 {
		return nil, fmt.Errorf("world size %d out of range 1..64", world)
	}
	s, err := b(world)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", collective, algorithm, err)
	}
	return s, nil
}

// CanRun reports whether an algorithm can run on a topology kind at a world
// size: the schedule must exist, every peer access must use a link of the
// topology, and a push (LL) schedule needs a GPU kind. The error says why
// not.
func CanRun(kind coll.TopologyKind, collective coll.Collective, algorithm coll.Algorithm, world int) error {
	topo, err := NewTopology(kind, world)
	if err != nil {
		return err
	}
	s, err := Build(collective, algorithm, world)
	if err != nil {
		return err
	}
	if err := HostCanRun(s); kind == coll.HostSHM && err != nil {
		return err
	}
	return CheckLinks(s, topo)
}

// HostCanRun reports whether the host backend can execute a schedule: it
// maps peers' segments read-only, so schedules that write into peers'
// memory (push protocols) are GPU-only.
func HostCanRun(s *Schedule) error {
	if s.Protocol.Push() {
		return fmt.Errorf("%s %s writes into peers' memory (%s protocol), which the host backend does not allow (peers' segments are mapped read-only); use it on a GPU topology", s.Collective, s.Algorithm, s.Protocol)
	}
	return nil
}

// stageCopies copies every chunk of the input into this rank's stage buffer,
// skipping the rank's own chunk when skipSelf is set (peers never read it).
func stageCopies(w int, skipSelf bool) []Step {
	var steps []Step
	for k := 0; k < w; k++ {
		if skipSelf && k == 0 {
			continue
		}
		c := Rel(k)
		steps = append(steps, Step{Kind: Copy,
			Dst:  Ref{Buf: Stage, Rank: Self, Chunk: c},
			Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: c}}})
	}
	return steps
}

// allReduceOneShot: every rank stages its input, then reduces every chunk
// from every rank's stage in absolute rank order (so all ranks produce
// bitwise-identical results) straight into its output.
func allReduceOneShot(w int) (*Schedule, error) {
	s := &Schedule{Collective: coll.AllReduce, Algorithm: coll.OneShot, World: w, InChunks: w, OutChunks: w}
	s.Phases = append(s.Phases, Phase{Steps: stageCopies(w, false), Sync: true})
	var steps []Step
	for k := 0; k < w; k++ {
		c := Rel(k)
		st := Step{Kind: Reduce, Dst: Ref{Buf: Output, Rank: Self, Chunk: c}}
		for p := 0; p < w; p++ {
			st.Srcs = append(st.Srcs, Ref{Buf: Stage, Rank: ConstIndex(p), Chunk: c})
		}
		steps = append(steps, st)
	}
	s.Phases = append(s.Phases, Phase{Steps: steps, Sync: true})
	return s, nil
}

// reduceOwnChunk is the step that reduces this rank's chunk of every
// rank's input into dst: its own input's chunk first, then each peer's
// staged copy, in rank order from itself (two-shot's and reduce-scatter's
// reduce).
func reduceOwnChunk(w int, dst Ref) Step {
	red := Step{Kind: Reduce, Dst: dst, Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: Self}}}
	for k := 1; k < w; k++ {
		red.Srcs = append(red.Srcs, Ref{Buf: Stage, Rank: Rel(k), Chunk: Self})
	}
	return red
}

// allReduceTwoShot: reduce-scatter (rank r reduces chunk r from every rank
// into its own scratch) then all-gather (every rank copies each reduced chunk
// from its owner's scratch). Each chunk is reduced once, so results agree
// everywhere. The stage buffer is only ever written by the copy-in, so a
// caller may pass a stage buffer as input (zero-copy) and keep its data.
func allReduceTwoShot(w int) (*Schedule, error) {
	s := &Schedule{Collective: coll.AllReduce, Algorithm: coll.TwoShot, World: w, InChunks: w, OutChunks: w, UsesScratch: true}
	s.Phases = append(s.Phases, Phase{Steps: stageCopies(w, true), Sync: true})
	red := reduceOwnChunk(w, Ref{Buf: Scratch, Rank: Self, Chunk: Self})
	s.Phases = append(s.Phases, Phase{Steps: []Step{red}, Sync: true})
	var gather []Step
	for k := 0; k < w; k++ {
		gather = append(gather, Step{Kind: Copy,
			Dst:  Ref{Buf: Output, Rank: Self, Chunk: Rel(k)},
			Srcs: []Ref{{Buf: Scratch, Rank: Rel(k), Chunk: Rel(k)}}})
	}
	s.Phases = append(s.Phases, Phase{Steps: gather, Sync: true})
	return s, nil
}

// allReduceHCM is PyTorch IntraNodeComm's hybrid-cube-mesh all-reduce for 8
// GPUs in two fully connected quads {0..3}, {4..7} with links i <-> i+4: each
// rank sums its quad's staged inputs into its scratch, then adds the partial
// of its relay (the rank with the same place in the other quad). Only quad
// and relay links are read, and every rank computes quad0 + quad1 in the
// same order.
func allReduceHCM(w int) (*Schedule, error) {
	if w != 8 {
		return nil, fmt.Errorf("hcm needs world size 8 (two quads of 4), not %d", w)
	}
	// The quad partials stay in the accumulator type (AccScratch): rounded
	// to the dtype, an f16 or bf16 sum would be rounded three times.
	s := &Schedule{Collective: coll.AllReduce, Algorithm: coll.HCM, World: w, InChunks: w, OutChunks: w, UsesScratch: true, AccScratch: true}
	s.Phases = append(s.Phases, Phase{Steps: stageCopies(w, false), Sync: true})
	quad := make([][]int, 4) // quad[j][r] = j-th member of r's quad
	for j := range quad {
		quad[j] = make([]int, w)
		for r := 0; r < w; r++ {
			quad[j][r] = r&4 + j
		}
	}
	pair := make([][]int, 2) // pair[0][r] = r's quad-0 member, pair[1][r] its quad-1 member
	for h := range pair {
		pair[h] = make([]int, w)
		for r := 0; r < w; r++ {
			pair[h][r] = r&3 + 4*h
		}
	}
	var partial, final []Step
	for k := 0; k < w; k++ {
		c := Rel(k)
		st := Step{Kind: Reduce, Dst: Ref{Buf: Scratch, Rank: Self, Chunk: c}}
		for j := range quad {
			st.Srcs = append(st.Srcs, Ref{Buf: Stage, Rank: TableIndex(quad[j]), Chunk: c})
		}
		partial = append(partial, st)
		fin := Step{Kind: Reduce, Dst: Ref{Buf: Output, Rank: Self, Chunk: c}}
		for h := range pair {
			fin.Srcs = append(fin.Srcs, Ref{Buf: Scratch, Rank: TableIndex(pair[h]), Chunk: c})
		}
		final = append(final, fin)
	}
	s.Phases = append(s.Phases, Phase{Steps: partial, Sync: true}, Phase{Steps: final, Sync: true})
	return s, nil
}

// reduceScatterOneShot: every rank stages the chunks its peers own, then
// reduces its own chunk from every rank.
func reduceScatterOneShot(w int) (*Schedule, error) {
	s := &Schedule{Collective: coll.ReduceScatter, Algorithm: coll.OneShot, World: w, InChunks: w, OutChunks: 1}
	s.Phases = append(s.Phases, Phase{Steps: stageCopies(w, true), Sync: true})
	red := reduceOwnChunk(w, Ref{Buf: Output, Rank: Self, Chunk: ConstIndex(0)})
	s.Phases = append(s.Phases, Phase{Steps: []Step{red}, Sync: true})
	return s, nil
}

// allGatherOneShot: every rank stages its input as its own chunk, then copies
// every rank's chunk into its output.
func allGatherOneShot(w int) (*Schedule, error) {
	s := &Schedule{Collective: coll.AllGather, Algorithm: coll.OneShot, World: w, InChunks: 1, OutChunks: w}
	s.Phases = append(s.Phases, Phase{Sync: true, Steps: []Step{{Kind: Copy,
		Dst:  Ref{Buf: Stage, Rank: Self, Chunk: Self},
		Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: ConstIndex(0)}}}}})
	var gather []Step
	for k := 0; k < w; k++ {
		src := Ref{Buf: Stage, Rank: Rel(k), Chunk: Rel(k)}
		if k == 0 {
			src = Ref{Buf: Input, Rank: Self, Chunk: ConstIndex(0)}
		}
		gather = append(gather, Step{Kind: Copy, Dst: Ref{Buf: Output, Rank: Self, Chunk: Rel(k)}, Srcs: []Ref{src}})
	}
	s.Phases = append(s.Phases, Phase{Steps: gather, Sync: true})
	return s, nil
}

// inbox returns the Ref of chunk c in lane `lane` of rank `rank`'s Inbox.
func inbox(rank, lane, c Index) Ref { return Ref{Buf: Inbox, Rank: rank, Lane: lane, Chunk: c} }

// allReduceOneShotLL: every rank puts its whole input into every rank's
// Inbox (its own included, so that the reduction below can name all W
// contributions by absolute lane), then reduces every chunk from its own
// Inbox in absolute lane order, waiting per line for the data. All ranks
// reduce in the same order, so results are bitwise identical. One one-way
// trip of NVLink latency, no barrier.
func allReduceOneShotLL(w int) (*Schedule, error) {
	s := &Schedule{Collective: coll.AllReduce, Algorithm: coll.OneShotLL, World: w, InChunks: w, OutChunks: w, Protocol: coll.LL}
	var puts, reds []Step
	for j := 0; j < w; j++ {
		c := Rel(j)
		for k := 0; k < w; k++ {
			puts = append(puts, Step{Kind: Put, Dst: inbox(Rel(k), Self, c), Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: c}}})
		}
		st := Step{Kind: Reduce, Dst: Ref{Buf: Output, Rank: Self, Chunk: c}}
		for p := 0; p < w; p++ {
			st.Srcs = append(st.Srcs, inbox(Self, ConstIndex(p), c))
		}
		reds = append(reds, st)
	}
	s.Phases = []Phase{{Steps: puts}, {Steps: reds}}
	return s, nil
}

// allReduceTwoShotLL: rank r puts chunk k of its input into rank k's Inbox;
// rank k reduces its chunk from its own input and its Inbox and puts the
// result into every peer's Inbox (fused with the reduce: the same thread
// writes the output line and sends it); every rank copies the other
// reduced chunks out of its Inbox. Two one-way trips, no barrier.
func allReduceTwoShotLL(w int) (*Schedule, error) {
	s := &Schedule{Collective: coll.AllReduce, Algorithm: coll.TwoShotLL, World: w, InChunks: w, OutChunks: w, Protocol: coll.LL}
	var scatter []Step
	for k := 1; k < w; k++ {
		scatter = append(scatter, Step{Kind: Put, Dst: inbox(Rel(k), Self, Rel(k)), Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: Rel(k)}}})
	}
	red := Step{Kind: Reduce, Dst: Ref{Buf: Output, Rank: Self, Chunk: Self}, Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: Self}}}
	for k := 1; k < w; k++ {
		red.Srcs = append(red.Srcs, inbox(Self, Rel(k), Self))
	}
	reduce := []Step{red}
	for k := 1; k < w; k++ {
		reduce = append(reduce, Step{Kind: Put, Dst: inbox(Rel(k), Self, Self), Srcs: []Ref{red.Dst}})
	}
	var gather []Step
	for k := 1; k < w; k++ {
		gather = append(gather, Step{Kind: Copy, Dst: Ref{Buf: Output, Rank: Self, Chunk: Rel(k)}, Srcs: []Ref{inbox(Self, Rel(k), Rel(k))}})
	}
	s.Phases = []Phase{{Steps: scatter}, {Steps: reduce}, {Steps: gather}}
	return s, nil
}

// reduceScatterOneShotLL: rank r puts chunk k of its input into rank k's
// Inbox, then reduces its own chunk from its input and its Inbox.
func reduceScatterOneShotLL(w int) (*Schedule, error) {
	s := &Schedule{Collective: coll.ReduceScatter, Algorithm: coll.OneShotLL, World: w, InChunks: w, OutChunks: 1, Protocol: coll.LL}
	var puts []Step
	for k := 1; k < w; k++ {
		puts = append(puts, Step{Kind: Put, Dst: inbox(Rel(k), Self, Rel(k)), Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: Rel(k)}}})
	}
	red := Step{Kind: Reduce, Dst: Ref{Buf: Output, Rank: Self, Chunk: ConstIndex(0)}, Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: Self}}}
	for k := 1; k < w; k++ {
		red.Srcs = append(red.Srcs, inbox(Self, Rel(k), Self))
	}
	s.Phases = []Phase{{Steps: puts}, {Steps: []Step{red}}}
	return s, nil
}

// allGatherOneShotLL: every rank puts its input into every peer's Inbox,
// copies its own input into place, then copies the peers' chunks out of its
// Inbox.
func allGatherOneShotLL(w int) (*Schedule, error) {
	s := &Schedule{Collective: coll.AllGather, Algorithm: coll.OneShotLL, World: w, InChunks: 1, OutChunks: w, Protocol: coll.LL}
	in := Ref{Buf: Input, Rank: Self, Chunk: ConstIndex(0)}
	var puts []Step
	for k := 1; k < w; k++ {
		puts = append(puts, Step{Kind: Put, Dst: inbox(Rel(k), Self, Self), Srcs: []Ref{in}})
	}
	gather := []Step{{Kind: Copy, Dst: Ref{Buf: Output, Rank: Self, Chunk: Self}, Srcs: []Ref{in}}}
	for k := 1; k < w; k++ {
		gather = append(gather, Step{Kind: Copy, Dst: Ref{Buf: Output, Rank: Self, Chunk: Rel(k)}, Srcs: []Ref{inbox(Self, Rel(k), Rel(k))}})
	}
	s.Phases = []Phase{{Steps: puts}, {Steps: gather}}
	return s, nil
}
