package cuda

import (
	"fmt"
	"slices"
	"strings"

	"github.com/collgen/collgen/schedule"
)

// Loops: most phases are W copies of one step that differ only in which
// chunk (and whose buffer) they touch, rank+K for K = 0, 1, 2, ...
// Rendered one block per step, every copy inlines the whole copy or
// reduce loop (cg_copy, cg_reduce, a push group's unit loop) again, and
// the compiler's time grows with W (world 8: eight copies of eight). A run
// of such steps is rendered instead as one C loop over k: each iteration
// runs the very same inner loop the unrolled block ran, in the same order,
// and the compiler sees it once. `#pragma unroll 1` keeps the compiler
// from unrolling it back.
//
// How: the run's groups are rendered one by one while index records
// every index the emitter asks for and writes a placeholder instead (the
// recording), so the groups' texts can be compared and their indices set
// side by side, whatever the emitter derives them from (a chunk, an inbox
// place). The run is a loop when the texts are the same and each index is
// either the same in every group or rank+K0+k in group k; the loop body is
// the first group's text with each placeholder replaced by the index's C
// expression. Any other index (push kernels' inbox places, per-rank
// tables that change from group to group) becomes a lookup table of one
// row per iteration, name[k][rank] (loopTable). Groups whose texts differ
// stay one block each, as before.

// placeholder is what index writes for the i-th index of a recording.
func placeholder(i int) string { return fmt.Sprintf("\x00%d\x00", i) }

// pushLoopMinWorld is the smallest world whose push (LL, LL128) kernels
// loop. A loop costs latency where the unrolled blocks let the compiler
// overlap the groups' memory operations: on 2 x H200 (bf16 all-reduce,
// graph replay, one run) looping made the world-2 oneshot_ll 0.2 us slower
// at 1 KiB (3.82 against 3.61 us) and oneshot_ll128 0.5 us (5.55 against
// 5.05), while the barrier kernels, which auto uses from megabytes up, ran
// as fast as unrolled from 1 MiB on (1 KiB one-shot: 8.77 against 8.54).
// Push kernels are the small-message path, so they stay unrolled where
// unrolling is cheap to compile; at world 8 a one-shot group is eight
// puts of eight groups, and there the loop cuts the file's compile time
// several times over.
const pushLoopMinWorld = 8

// blocks renders a phase's groups (a barrier step is a group of one; push
// groups come from llGroups) with render: when loops is set, each longest
// run of groups whose recorded texts are the same as one loop, and a group
// that starts no run (or every group, without loops) as its own block.
// Each group is rendered once: with loops, its recording is what both a
// loop and a block of its own are made from.
func (e *kernelEmitter) blocks(groups [][]schedule.Step, loops bool, render func([]schedule.Step) (stepContext, error)) ([]stepContext, error) {
	var recs []recording
	if loops {
		recs = make([]recording, len(groups))
		for i, g := range groups {
			recs[i] = e.record(g, render)
		}
	}
	var out []stepContext
	for i := 0; i < len(groups); {
		n := 1
		for loops && recs[i].ok && i+n < len(groups) && recs[i+n].ok && slices.Equal(recs[i+n].sc.Lines, recs[i].sc.Lines) {
			n++
		}
		switch {
		case n > 1:
			out = append(out, e.loop(groups[i:i+n], recs[i:i+n]))
		case loops && recs[i].ok: // its recording, with the indices written in
			sc, rec := recs[i].sc, recs[i].rec
			sc.Lines = fill(recs[i], func(j int) string { return e.index(rec[j]) })
			out = append(out, sc)
		default:
			sc, err := render(groups[i])
			if err != nil {
				return nil, err
			}
			out = append(out, sc)
		}
		i += n
	}
	return out, nil
}

// recording is a group rendered with placeholders for its indices, and
// the indices (ok false when rendering failed: the group is then rendered
// alone, which reports the error).
type recording struct {
	sc  stepContext
	rec []schedule.Index
	ok  bool
}

// record renders g while index records every index it is asked for.
func (e *kernelEmitter) record(g []schedule.Step, render func([]schedule.Step) (stepContext, error)) recording {
	e.recording, e.rec = true, nil
	sc, err := render(g)
	e.recording = false
	return recording{sc: sc, rec: e.rec, ok: err == nil}
}

// loop renders run, whose recordings recs have the same text, as one loop
// over k (see above), declaring the loop tables it needs.
func (e *kernelEmitter) loop(run [][]schedule.Step, recs []recording) stepContext {
	body := fill(recs[0], func(j int) string {
		x := recs[0].rec[j]
		col := make([]schedule.Index, len(run))
		for i := range run {
			col[i] = recs[i].rec[j]
		}
		switch same, step := loopColumn(col, e.s.World); {
		case same:
			return e.index(x)
		case step:
			return loopRel(x.K)
		default:
			return e.loopTable(col) + "[k][rank]"
		}
	})
	out := stepContext{Comment: fmt.Sprintf("k = 0..%d, one loop: %s ... %s", len(run)-1, groupComment(run[0]), groupComment(run[len(run)-1]))}
	out.Lines = append(out.Lines, "#pragma unroll 1", fmt.Sprintf("for (int k = 0; k < %d; k++) {", len(run)))
	for _, line := range body {
		out.Lines = append(out.Lines, "  "+line)
	}
	out.Lines = append(out.Lines, "}")
	return out
}

// fill is rec's lines with the j-th placeholder replaced by expr(j),
// which is called once per index, in recording order: the order in which
// rendering the group would have asked for them (so tables are declared
// in the same order).
func fill(rec recording, expr func(j int) string) []string {
	pairs := make([]string, 0, 2*len(rec.rec))
	for j := range rec.rec {
		pairs = append(pairs, placeholder(j), expr(j))
	}
	r := strings.NewReplacer(pairs...)
	lines := make([]string, len(rec.sc.Lines))
	for i, line := range rec.sc.Lines {
		lines[i] = r.Replace(line)
	}
	return lines
}

// loopColumn says how one index varies over a run's groups: the same in
// all (same), or rank+K0+k in group k with K0+k < w (step), so that
// loopRel's single wrap suffices.
func loopColumn(col []schedule.Index, w int) (same, step bool) {
	same, step = true, true
	for k, x := range col {
		same = same && x.Equal(col[0])
		step = step && x.Kind == schedule.RankPlus && col[0].Kind == schedule.RankPlus && x.K == col[0].K+k && x.K < w
	}
	return same, step && !same
}

// loopTable declares (once per distinct content) the lookup table of a
// loop index that is neither the same in every group nor rank+K0+k: row k
// holds group k's index on every rank, so name[k][rank] is what the
// group's own block computed (a constant, cg_rel or a per-rank table).
func (e *kernelEmitter) loopTable(col []schedule.Index) string {
	w := e.s.World
	rows := make([][]int, len(col))
	for k, x := range col {
		rows[k] = make([]int, w)
		for r := range w {
			rows[k][r] = x.Eval(r, w)
		}
	}
	return e.declare(table{Rows: rows, Indices: col})
}

// loopRel is the C expression of rank + k0 + k mod W.
func loopRel(k0 int) string {
	if k0 == 0 {
		return "cg_rel(rank, k, W)"
	}
	return fmt.Sprintf("cg_rel(rank, k + %d, W)", k0)
}

// maxFusedCopies bounds a copy group (copyGroups): the barrier kernels run
// up to 1024 threads per block, 64 registers a thread, and with three or
// four copies (each a vector, two pointers and a count in the loop, and
// cg_copy's shuffling path inlined for misaligned buffers) the world-4 and
// world-8 kernels spilled (nvcc 11.8, sm_90).
const maxFusedCopies = 2

// copyGroups splits a barrier phase's steps (world w) into groups: runs
// of up to maxFusedCopies copies that share no chunk on any rank (no copy
// writes a chunk another one reads or writes) and of which one reads a
// peer, rendered as one cg_copies call, and every other step alone. The
// schedule simulation runs a phase's steps one after the other on each
// rank; sharing no chunk is what makes cg_copies' interleaving of them
// within a thread give the same result. Copies that all read the rank's
// own memory gain nothing from it and stay apart.
func copyGroups(steps []schedule.Step, w int) [][]schedule.Step {
	var groups [][]schedule.Step
	for i := 0; i < len(steps); {
		j := i + 1
		for steps[i].Kind == schedule.Copy && j < len(steps) && j-i < maxFusedCopies && steps[j].Kind == schedule.Copy && disjoint(steps[i:j], steps[j], w) {
			j++
		}
		if !slices.ContainsFunc(steps[i:j], func(st schedule.Step) bool { return !st.Srcs[0].Rank.IsSelf() }) {
			j = i + 1
		}
		groups = append(groups, steps[i:j])
		i = j
	}
	return groups
}

// disjoint reports whether copy st touches no chunk that a copy of g writes
// and writes none that one of them reads, on any rank of a w-rank world.
func disjoint(g []schedule.Step, st schedule.Step, w int) bool {
	for _, o := range g {
		if schedule.Overlap(o.Dst, st.Dst, w) || schedule.Overlap(o.Dst, st.Srcs[0], w) || schedule.Overlap(st.Dst, o.Srcs[0], w) {
			return false
		}
	}
	return true
}

// groupComment renders a group's steps for the generated code's comments.
func groupComment(g []schedule.Step) string {
	cs := make([]string, len(g))
	for i, st := range g {
		cs[i] = stepComment(st)
	}
	return strings.Join(cs, "; ")
}
