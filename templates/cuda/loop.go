package cuda

import (
	"fmt"
	"strings"

	"github.com/collgen/collgen/schedule"
)

// Loops: most phases are W copies of one step that differ only in which
// chunk (and whose buffer) they touch, rank+K for K = 0, 1, 2, ...
// Rendered one block per step, every copy inlines the whole copy or
// reduce loop (cg_copy, cg_reduce, a push group's unit loop) again, and
// the compiler's time grows with W (world 8: eight copies of eight). A run
// of such steps is rendered instead as one C loop over k whose body is the
// first step with those indices written rank+K+k: each iteration runs the
// very same inner loop the unrolled block ran, in the same order, and the
// compiler sees it once. `#pragma unroll 1` keeps the compiler from
// unrolling it back.

// loop is a run of n consecutive step groups of one phase (a barrier step
// is a group of one; push groups come from llGroups) in which group i is
// group 0 with some RankPlus indices advanced by i. body is group 0 with
// those indices marked (loopIndex); first and last are the run's first and
// last groups, for the comment. A loop with n == 1 is an ordinary block.
type loop struct {
	body, first, last []schedule.Step
	n                 int
}

// loopBias marks a loop index: a RankPlus index whose K is loopBias + K0
// means rank + K0 + k, k the loop counter. Schedules' indices lie in
// [0, W), far below it, and the mark travels inside an ordinary
// schedule.Index, so the step emitters render loop bodies unchanged.
const loopBias = 1 << 30

// loopIndex marks index x (rank + K0 in a run's first group) as advancing
// with the loop counter.
func loopIndex(x schedule.Index) schedule.Index {
	return schedule.Index{Kind: schedule.RankPlus, K: loopBias + x.K}
}

// loopK returns K0 of a loop index.
func loopK(x schedule.Index) (int, bool) {
	if x.Kind != schedule.RankPlus || x.K < loopBias {
		return 0, false
	}
	return x.K - loopBias, true
}

// loopRel is the C expression of rank + k0 + k mod W (k0 + k < W, which
// loops checks, so cg_rel's one subtraction suffices).
func loopRel(k0 int) string {
	if k0 == 0 {
		return "cg_rel(rank, k, W)"
	}
	return fmt.Sprintf("cg_rel(rank, k + %d, W)", k0)
}

// singles makes each step a group of its own (barrier schedules).
func singles(steps []schedule.Step) [][]schedule.Step {
	groups := make([][]schedule.Step, len(steps))
	for i := range steps {
		groups[i] = steps[i : i+1]
	}
	return groups
}

// loops splits a phase's groups into runs, longest first from the left;
// a group that starts no run is a loop of one.
func loops(groups [][]schedule.Step, w int) []loop {
	var out []loop
	for i := 0; i < len(groups); {
		n := 1
		for i+n < len(groups) && isRun(groups[i:i+n+1], w) {
			n++
		}
		l := loop{body: groups[i], first: groups[i], last: groups[i+n-1], n: n}
		if n > 1 {
			l.body = markGroup(groups[i], groups[i+1])
		}
		out = append(out, l)
		i += n
	}
	return out
}

// isRun reports whether groups form a run: the same shape (step kinds,
// sources, buffers), and every index either the same in all groups or
// rank+K0+i in group i, with K0+i < w.
func isRun(groups [][]schedule.Step, w int) bool {
	g0 := groups[0]
	for _, g := range groups[1:] {
		if len(g) != len(g0) {
			return false
		}
		for s := range g {
			if g[s].Kind != g0[s].Kind || len(g[s].Srcs) != len(g0[s].Srcs) {
				return false
			}
		}
	}
	for s, st := range g0 {
		for r := range len(st.Srcs) + 1 {
			col := make([]schedule.Ref, len(groups))
			for i, g := range groups {
				col[i] = refAt(g[s], r)
			}
			if !refsRun(col, w) {
				return false
			}
		}
	}
	return true
}

// refAt is a step's destination (r == 0) or source r-1.
func refAt(st schedule.Step, r int) schedule.Ref {
	if r == 0 {
		return st.Dst
	}
	return st.Srcs[r-1]
}

// refsRun reports whether the refs at one place of a run's groups name one
// buffer through indices that are each constant or advance by one.
func refsRun(col []schedule.Ref, w int) bool {
	for _, r := range col {
		if r.Buf != col[0].Buf {
			return false
		}
	}
	for _, idx := range []func(schedule.Ref) schedule.Index{
		func(r schedule.Ref) schedule.Index { return r.Rank },
		func(r schedule.Ref) schedule.Index { return r.Lane },
		func(r schedule.Ref) schedule.Index { return r.Chunk },
	} {
		same, step := true, idx(col[0]).Kind == schedule.RankPlus
		for i, r := range col {
			x := idx(r)
			same = same && x.Equal(idx(col[0]))
			step = step && x.Kind == schedule.RankPlus && x.K == idx(col[0]).K+i && x.K < w
		}
		if !same && !step {
			return false
		}
	}
	return true
}

// markGroup returns the loop body of a run that starts with groups a, b:
// a with every index that differs in b marked as a loop index.
func markGroup(a, b []schedule.Step) []schedule.Step {
	mark := func(x, y schedule.Index) schedule.Index {
		if x.Equal(y) {
			return x
		}
		return loopIndex(x)
	}
	markRef := func(x, y schedule.Ref) schedule.Ref {
		return schedule.Ref{Buf: x.Buf, Rank: mark(x.Rank, y.Rank), Lane: mark(x.Lane, y.Lane), Chunk: mark(x.Chunk, y.Chunk)}
	}
	body := make([]schedule.Step, len(a))
	for s, st := range a {
		body[s] = schedule.Step{Kind: st.Kind, Dst: markRef(st.Dst, b[s].Dst), Srcs: make([]schedule.Ref, len(st.Srcs))}
		for j := range st.Srcs {
			body[s].Srcs[j] = markRef(st.Srcs[j], b[s].Srcs[j])
		}
	}
	return body
}

// groupComment renders a group's steps for the generated code's comments.
func groupComment(g []schedule.Step) string {
	cs := make([]string, len(g))
	for i, st := range g {
		cs[i] = stepComment(st)
	}
	return strings.Join(cs, "; ")
}

// wrap turns the block rendered for the loop's body into the loop: the
// body's lines inside `for (int k = 0; k < n; k++)`. A loop of one is
// returned as it is.
func (l loop) wrap(sc stepContext) stepContext {
	if l.n == 1 {
		return sc
	}
	out := stepContext{Comment: fmt.Sprintf("k = 0..%d, one loop: %s ... %s", l.n-1, groupComment(l.first), groupComment(l.last))}
	out.Lines = append(out.Lines, "#pragma unroll 1", fmt.Sprintf("for (int k = 0; k < %d; k++) {", l.n))
	for _, line := range sc.Lines {
		out.Lines = append(out.Lines, "  "+line)
	}
	out.Lines = append(out.Lines, "}")
	return out
}
