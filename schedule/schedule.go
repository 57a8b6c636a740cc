// Package schedule is collgen's intermediate representation: every collective
// algorithm is written once as a Schedule, a short list of phases in which each
// rank copies or reduces chunks of its own and its peers' buffers, separated by
// barriers. The CUDA templates render schedules into kernels, the host backend
// executes them over shared memory, and the simulator and checkers in this
// package prove them correct for any world size and topology.
//
// Data model. A collective over W ranks splits its data into W chunks. Chunk i
// covers elements [min(i*C, N), min((i+1)*C, N)) of an N-element buffer, where
// C is the chunk size chosen at run time (see ChunkElems). Every rank holds
// five buffers:
//
//	Input   the caller's input (private to the rank)
//	Output  the caller's output (private to the rank)
//	Stage   a symmetric buffer of W chunks that peers may read
//	Scratch a second symmetric buffer of W chunks, for partial results
//	Inbox   W lanes of W chunks that peers write into (LL protocol only):
//	        lane s is written only by rank s, each chunk at most once per
//	        collective
//
// A step names buffers through Refs whose rank, lane and chunk are Index
// expressions of the executing rank, so one Schedule serves every rank.
//
// Two protocols (coll.Protocol). With coll.Barrier (pull), steps write only the executing
// rank's buffers and read peers' Stage and Scratch, and phases end in
// barriers. With coll.LL (low latency, push), Put steps write into peers'
// Inboxes, every Inbox line carries its collective's flag next to its data,
// and a step that reads an Inbox chunk waits for the flags of exactly the
// lines it reads: there are no barriers, and a rank waits only for the data
// it needs. coll.LL128 is the same push protocol with a denser line:
// schedules are identical, only the kernels' line format differs.
package schedule

import (
	"fmt"
	"strings"

	"github.com/collgen/collgen/coll"
)

// Buffer names one of a rank's five buffers (the package comment says
// what each holds).
type Buffer int

// The buffers.
const (
	Input   Buffer = iota // the caller's input
	Output                // the caller's output
	Stage                 // W chunks peers may read (symmetric)
	Scratch               // W chunks of partial results (symmetric)
	Inbox                 // W lanes of W chunks peers write into (push protocols)
)

// NumBuffers is how many buffers a rank holds.
const NumBuffers = 5

// String names the buffer.
func (b Buffer) String() string {
	return [...]string{"input", "output", "stage", "scratch", "inbox"}[b]
}

// Symmetric reports whether peers may read the buffer (it lives in memory
// every rank has mapped).
func (b Buffer) Symmetric() bool { return b == Stage || b == Scratch }

// IndexKind says how an Index is evaluated.
type IndexKind int

const (
	// Const is the fixed value K.
	Const IndexKind = iota
	// RankPlus is (rank + K) mod W.
	RankPlus
	// Table is Table[rank].
	Table
)

// Index is a rank or chunk number written as a function of the executing
// rank, so that one schedule serves all ranks.
type Index struct {
	Kind  IndexKind // how to read K and Table
	K     int       // the constant (Const) or the offset from the rank (RankPlus)
	Table []int     // Table: the value for each rank, len W; nil otherwise
}

// ConstIndex returns the index that is always k.
func ConstIndex(k int) Index { return Index{Kind: Const, K: k} }

// Self is the executing rank.
var Self = Index{Kind: RankPlus, K: 0}

// Rel returns the index (rank + k) mod W.
func Rel(k int) Index { return Index{Kind: RankPlus, K: k} }

// TableIndex returns the index t[rank].
func TableIndex(t []int) Index { return Index{Kind: Table, Table: append([]int(nil), t...)} }

// Eval returns the index's value on rank in a world of w ranks.
func (x Index) Eval(rank, w int) int {
	switch x.Kind {
	case Const:
		return x.K
	case RankPlus:
		return ((rank+x.K)%w + w) % w
	default:
		return x.Table[rank]
	}
}

// Equal reports whether two indices are the same expression.
func (x Index) Equal(y Index) bool {
	if x.Kind != y.Kind || x.K != y.K || len(x.Table) != len(y.Table) {
		return false
	}
	for i := range x.Table {
		if x.Table[i] != y.Table[i] {
			return false
		}
	}
	return true
}

// IsSelf reports whether the index always names the executing rank.
func (x Index) IsSelf() bool { return x.Kind == RankPlus && x.K == 0 }

// String writes the index as schedules print it (rank, rank+1, 3, ...).
func (x Index) String() string {
	switch x.Kind {
	case Const:
		return fmt.Sprint(x.K)
	case RankPlus:
		if x.K == 0 {
			return "rank"
		}
		return fmt.Sprintf("rank+%d", x.K)
	default:
		return fmt.Sprintf("%v[rank]", x.Table)
	}
}

// Ref is one chunk of one rank's buffer.
type Ref struct {
	Buf   Buffer // which buffer: Input, Output, Stage, Scratch or Inbox
	Rank  Index  // whose buffer; always Self for Input and Output
	Lane  Index  // Inbox only: the lane, i.e. the rank that writes it
	Chunk Index  // which chunk of the buffer
}

// Equal reports whether two refs name the same chunk on every rank.
func (r Ref) Equal(o Ref) bool {
	return r.Buf == o.Buf && r.Rank.Equal(o.Rank) && r.Lane.Equal(o.Lane) && r.Chunk.Equal(o.Chunk)
}

// String writes the reference as schedules print it.
func (r Ref) String() string {
	if r.Buf == Inbox {
		return fmt.Sprintf("%s@%s[%s][%s]", r.Buf, r.Rank, r.Lane, r.Chunk)
	}
	return fmt.Sprintf("%s@%s[%s]", r.Buf, r.Rank, r.Chunk)
}

// StepKind says what a step computes.
type StepKind int

const (
	// Copy copies its single source into the destination.
	Copy StepKind = iota
	// Reduce combines every source with the reduce op, in source order, and
	// writes the result to the destination. Source order is part of the
	// schedule's contract: all ranks that compute the same chunk use the
	// same order so their results are bitwise identical.
	Reduce
	// Put copies its single source (the executing rank's) into a peer's
	// Inbox, in the executing rank's lane (push protocols only).
	Put
)

// String names the step kind.
func (k StepKind) String() string { return [...]string{"copy", "reduce", "put"}[k] }

// Step writes one chunk, elementwise, from one or more source chunks of the
// same length.
type Step struct {
	Kind StepKind // copy, reduce or put
	Dst  Ref      // the chunk written
	Srcs []Ref    // the chunks read: one for Copy and Put; for Reduce, in reduction order
}

// Phase is a set of steps every rank runs, followed (if Sync) by a barrier
// among all ranks. Steps within a phase run in order on each rank; a rank
// may read a peer's chunk only if no rank writes that chunk in the same
// phase (CheckRaces enforces it).
type Phase struct {
	Steps []Step // run in order on every rank
	Sync  bool   // a barrier of all ranks follows the steps
}

// Schedule is one algorithm for one collective at one world size.
type Schedule struct {
	Collective coll.Collective // the collective it computes
	Algorithm  coll.Algorithm  // the builder's name (schedule/build.go)
	World      int             // ranks; a RankPlus index wraps mod World
	// InChunks and OutChunks are how many chunks the caller's input and
	// output hold: W, or 1 for the per-rank side of reduce-scatter's output
	// and all-gather's input.
	InChunks, OutChunks int
	// UsesScratch reports whether the schedule needs the Scratch buffer.
	UsesScratch bool
	// AccScratch: Scratch holds partial reductions in the accumulator type
	// (f32 for f16 and bf16), not the element type, so a sum through it is
	// rounded to the element type once, as a sum without it is. Only
	// Reduce steps may touch such a scratch. Two-shot's scratch holds
	// finished sums and does not need it.
	AccScratch bool
	// Protocol is how ranks synchronise; see the package comment.
	Protocol coll.Protocol
	Phases   []Phase // run in order; see Phase
}

// InboxChunks is how many chunk-sized Inbox areas a rank needs: the most
// inbox chunks the puts of a push schedule write into any one rank (see
// InboxLayout), none for a barrier schedule.
func (s *Schedule) InboxChunks() int {
	_, n := s.InboxLayout()
	return n
}

// InboxLayout places the inbox chunks a push schedule's puts write: for
// every owner rank, the (lane, chunk) pairs written into its inbox, in
// lane then chunk order, get consecutive places, and at[owner][lane][chunk]
// is a pair's place (-1: never written); n is the most places any owner
// needs. Memory then holds n chunk areas per slot instead of W lanes of W
// chunks: an all-reduce two-shot writes 2(W-1) chunks into each inbox, a
// reduce-scatter or all-gather one-shot W-1, an all-reduce one-shot
// W(W-1). Validate's rule that each inbox chunk is written at most once
// per collective is what makes a place hold one chunk.
func (s *Schedule) InboxLayout() (at [][][]int, n int) {
	if !s.Protocol.Push() {
		return nil, 0
	}
	w := s.World
	at = make([][][]int, w)
	for o := range at {
		at[o] = make([][]int, w)
		for l := range at[o] {
			at[o][l] = make([]int, w)
			for c := range at[o][l] {
				at[o][l][c] = -1
			}
		}
	}
	for _, ph := range s.Phases {
		for _, st := range ph.Steps {
			if st.Kind != Put {
				continue
			}
			for e := 0; e < w; e++ {
				at[st.Dst.Rank.Eval(e, w)][st.Dst.Lane.Eval(e, w)][st.Dst.Chunk.Eval(e, w)] = 0 // written
			}
		}
	}
	for o := range at {
		k := 0
		for l := range at[o] {
			for c := range at[o][l] {
				if at[o][l][c] == 0 {
					at[o][l][c] = k
					k++
				}
			}
		}
		n = max(n, k)
	}
	return at, n
}

// InboxPlace is the place of an inbox ref's chunk in its owner's inbox,
// read from at, the layout InboxLayout returned (made once by callers
// that place many refs), as an index of the executing rank; an error if
// some rank would address a chunk no put writes.
func (s *Schedule) InboxPlace(at [][][]int, r Ref) (Index, error) {
	w := s.World
	t := make([]int, w)
	for e := range t {
		o, l, c := r.Rank.Eval(e, w), r.Lane.Eval(e, w), r.Chunk.Eval(e, w)
		if t[e] = at[o][l][c]; t[e] < 0 {
			return Index{}, fmt.Errorf("%s: rank %d addresses %s (inbox of rank %d, lane %d, chunk %d), which no put writes", s.Name(), e, r, o, l, c)
		}
	}
	for _, v := range t[1:] {
		if v != t[0] {
			return TableIndex(t), nil
		}
	}
	return ConstIndex(t[0]), nil
}

// Name is the schedule's readable name, e.g. "allreduce_twoshot_w4".
func (s *Schedule) Name() string {
	return fmt.Sprintf("%s_%s_w%d", s.Collective, s.Algorithm, s.World)
}

// Barriers counts the phases that end in a barrier.
func (s *Schedule) Barriers() int {
	n := 0
	for _, p := range s.Phases {
		if p.Sync {
			n++
		}
	}
	return n
}

// String renders the schedule in a compact human-readable form (used in
// generated comments and in test failures).
func (s *Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:\n", s.Name())
	for i, p := range s.Phases {
		fmt.Fprintf(&b, "  phase %d:\n", i)
		for _, st := range p.Steps {
			op := st.Kind.String()
			srcs := make([]string, len(st.Srcs))
			for j, r := range st.Srcs {
				srcs[j] = r.String()
			}
			fmt.Fprintf(&b, "    %s <- %s(%s)\n", st.Dst, op, strings.Join(srcs, ", "))
		}
		if p.Sync {
			b.WriteString("    barrier\n")
		}
	}
	return b.String()
}

// ChunkElems returns the chunk size, in elements, for a collective whose
// per-chunk natural size is perChunk elements (allreduce: ceil(N/W); the
// other collectives: the per-rank count), rounded up to a multiple of
// vecElems for allreduce so every chunk but the last starts 16-byte aligned.
// Reduce-scatter and all-gather chunks are exactly the per-rank count: the
// caller's layout fixes them.
func ChunkElems(collective coll.Collective, n, world, vecElems int) int {
	if collective != coll.AllReduce {
		return n / world
	}
	c := (n + world - 1) / world
	if vecElems > 1 {
		c = (c + vecElems - 1) / vecElems * vecElems
	}
	return c
}

// ChunkRange returns the element range [lo, hi) of chunk i for a buffer of
// n elements split into chunks of c elements.
func ChunkRange(i, c, n int) (lo, hi int) {
	lo, hi = i*c, (i+1)*c
	if lo > n {
		lo = n
	}
	if hi > n {
		hi = n
	}
	return lo, hi
}
