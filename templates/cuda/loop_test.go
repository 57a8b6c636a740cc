package cuda

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/plan"
	"github.com/collgen/collgen/schedule"
	"github.com/collgen/collgen/spec"
)

var (
	loopHead = regexp.MustCompile(`^for \(int k = 0; k < (\d+); k\+\+\) \{$`)
	loopVar  = regexp.MustCompile(`cg_rel\(rank, k( \+ (\d+))?, W\)|(table\d+)\[k\]\[rank\]`)
)

// unroll returns iteration i of a loop block's body, with k's expressions
// evaluated as the emitter writes the indices they stand for.
func unroll(e *kernelEmitter, body []string, i int) []string {
	out := make([]string, len(body))
	for j, line := range body {
		out[j] = loopVar.ReplaceAllStringFunc(line, func(m string) string {
			sub := loopVar.FindStringSubmatch(m)
			if sub[3] != "" { // a loop table: row i stands for an index
				for _, t := range e.tables {
					if t.Name == sub[3] {
						return e.index(t.Indices[i])
					}
				}
				panic("no loop table " + sub[3])
			}
			k0 := 0
			if sub[2] != "" {
				k0, _ = strconv.Atoi(sub[2])
			}
			return e.index(schedule.Rel(k0 + i))
		})
	}
	return out
}

// checkBlocks renders groups with blocks and checks that each loop's
// iteration i is, line for line, the block render writes for its group i
// alone, and that other blocks are render's; it returns the loops' lengths
// (1 for a block).
func checkBlocks(t *testing.T, e *kernelEmitter, name string, groups [][]schedule.Step, loops bool, render func([]schedule.Step) (stepContext, error)) []int {
	t.Helper()
	blocks, err := e.blocks(groups, loops, render)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var lens []int
	g := 0
	for _, b := range blocks {
		n, body := 1, b.Lines
		if len(b.Lines) > 2 && b.Lines[0] == "#pragma unroll 1" {
			m := loopHead.FindStringSubmatch(b.Lines[1])
			if m == nil || b.Lines[len(b.Lines)-1] != "}" {
				t.Fatalf("%s: malformed loop %q", name, b.Lines)
			}
			n, _ = strconv.Atoi(m[1])
			body = nil
			for _, l := range b.Lines[2 : len(b.Lines)-1] {
				body = append(body, strings.TrimPrefix(l, "  "))
			}
		}
		for i := range n {
			want, err := render(groups[g+i])
			if err != nil {
				t.Fatalf("%s group %d: %v", name, g+i, err)
			}
			if got := unroll(e, body, i); !slices.Equal(got, want.Lines) {
				t.Fatalf("%s group %d (iteration %d of a loop of %d):\n got %q\nwant %q", name, g+i, i, n, got, want.Lines)
			}
		}
		lens = append(lens, n)
		g += n
	}
	if g != len(groups) {
		t.Fatalf("%s: blocks cover %d groups of %d", name, g, len(groups))
	}
	return lens
}

// TestLoopsRunTheSchedule: for every kernel of the shipped spec, each loop
// iteration is the code of its step (or push group) rendered alone, in the
// schedule's order; and the world-8 one-shot barrier phases, W copies of
// one step, are one loop each.
func TestLoopsRunTheSchedule(t *testing.T) {
	s, err := spec.Load("../../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.New(s, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	blocks, loops := map[bool]int{}, map[bool]int{} // by push protocol
	for _, k := range p.Kernels {
		sch := k.Schedule
		e := &kernelEmitter{k: k, s: sch, byValues: map[string]string{}}
		for pi, ph := range sch.Phases {
			name := fmt.Sprintf("%s phase %d", k.Name, pi)
			groups := copyGroups(ph.Steps, sch.World)
			render := e.barrierGroup
			if sch.Protocol.Push() {
				groups = llGroups(ph.Steps)
				render = func(g []schedule.Step) (stepContext, error) { return e.pushGroup(g, pi) }
			}
			// Loops are checked wherever they could be made (push
			// kernels of every world too), then as the kernel renders.
			checkBlocks(t, e, name, groups, true, render)
			withLoops := !sch.Protocol.Push() || sch.World >= pushLoopMinWorld
			lens := checkBlocks(t, e, name, groups, withLoops, render)
			for _, n := range lens {
				blocks[sch.Protocol.Push()]++
				if n > 1 {
					loops[sch.Protocol.Push()]++
					if !withLoops {
						t.Errorf("%s: a loop of %d in a world-%d push kernel", name, n, sch.World)
					}
				}
			}
			if strings.HasPrefix(k.Name, "allreduce_oneshot_ll128_f32_sum_w8") && fmt.Sprint(lens) != "[8]" {
				t.Errorf("%s: blocks %v, want one loop of 8", name, lens)
			}
			if strings.HasPrefix(k.Name, "allreduce_oneshot_f32_sum_w8") && fmt.Sprint(lens) != "[8]" {
				t.Errorf("%s: blocks %v, want one loop of 8", name, lens)
			}
		}
		if e.err != nil {
			t.Fatalf("%s: %v", k.Name, e.err)
		}
	}
	if loops[false] == 0 || loops[true] == 0 {
		t.Fatalf("loops in the shipped kernels: barrier %d, push %d; want some of each", loops[false], loops[true])
	}
	t.Logf("%d kernels: barrier kernels %d blocks, %d of them loops; push kernels %d blocks, %d loops",
		len(p.Kernels), blocks[false], loops[false], blocks[true], loops[true])
}

// TestLoopsBreak: a run ends where the rendered text differs (a buffer);
// an index that neither stays the same nor advances by one (a table that
// changes, a step of two, past W - 1, constants) becomes a loop table.
func TestLoopsBreak(t *testing.T) {
	copyStep := func(dst, src schedule.Buffer, rank, chunk schedule.Index) []schedule.Step {
		return []schedule.Step{{Kind: schedule.Copy,
			Dst:  schedule.Ref{Buf: dst, Rank: schedule.Self, Chunk: chunk},
			Srcs: []schedule.Ref{{Buf: src, Rank: rank, Chunk: chunk}}}}
	}
	tab := schedule.TableIndex([]int{1, 0, 3, 2})
	tab2 := schedule.TableIndex([]int{2, 3, 0, 1})
	for _, c := range []struct {
		name   string
		groups [][]schedule.Step
		want   []int // loop lengths
	}{
		{"rank+k", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(1), schedule.Rel(1)),
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(2), schedule.Rel(2)),
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(3), schedule.Rel(3)),
		}, []int{3}},
		{"buffer changes", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(1), schedule.Rel(1)),
			copyStep(schedule.Output, schedule.Scratch, schedule.Rel(2), schedule.Rel(2)),
			copyStep(schedule.Output, schedule.Scratch, schedule.Rel(3), schedule.Rel(3)),
		}, []int{1, 2}},
		{"table changes: a loop table", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, tab, schedule.Rel(0)),
			copyStep(schedule.Output, schedule.Stage, tab2, schedule.Rel(1)),
		}, []int{2}},
		{"same table, chunk advances", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, tab, schedule.Rel(0)),
			copyStep(schedule.Output, schedule.Stage, tab, schedule.Rel(1)),
		}, []int{2}},
		{"step of two: a loop table", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(0), schedule.Rel(0)),
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(2), schedule.Rel(2)),
		}, []int{2}},
		{"past W-1: a loop table", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(3), schedule.Rel(3)),
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(4), schedule.Rel(4)),
		}, []int{2}},
		{"constants step: a loop table", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, schedule.ConstIndex(1), schedule.ConstIndex(1)),
			copyStep(schedule.Output, schedule.Stage, schedule.ConstIndex(2), schedule.ConstIndex(2)),
		}, []int{2}},
	} {
		e := &kernelEmitter{s: &schedule.Schedule{World: 4}, byValues: map[string]string{}}
		// A stand-in for the step emitters: the buffers as text, the
		// indices through e.index.
		render := func(g []schedule.Step) (stepContext, error) {
			st := g[0]
			return stepContext{Lines: []string{fmt.Sprintf("%s[%s][%s] = %s[%s][%s];",
				st.Dst.Buf, e.index(st.Dst.Rank), e.index(st.Dst.Chunk),
				st.Srcs[0].Buf, e.index(st.Srcs[0].Rank), e.index(st.Srcs[0].Chunk))}}, nil
		}
		if got := checkBlocks(t, e, c.name, c.groups, true, render); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: loops of %v, want %v", c.name, got, c.want)
		}
	}
}

// TestCopyGroups: a phase's copies are fused in pairs when one reads a
// peer and they share no chunk on any rank; anything else stays apart.
func TestCopyGroups(t *testing.T) {
	ag, err := schedule.Build(coll.AllGather, coll.OneShot, 4)
	if err != nil {
		t.Fatal(err)
	}
	lens := func(groups [][]schedule.Step) []int {
		var out []int
		for _, g := range groups {
			out = append(out, len(g))
		}
		return out
	}
	// Phase 1 gathers: the own block and three peers' blocks.
	if got := lens(copyGroups(ag.Phases[1].Steps, 4)); fmt.Sprint(got) != "[2 2]" {
		t.Errorf("all-gather world 4 gather phase: groups %v, want [2 2]", got)
	}
	// Phase 0 copies into the own stage only: nothing to overlap.
	if got := lens(copyGroups(ag.Phases[0].Steps, 4)); fmt.Sprint(got) != "[1]" {
		t.Errorf("all-gather stage phase: groups %v, want [1]", got)
	}
	ref := func(b schedule.Buffer, rank, chunk int) schedule.Ref {
		return schedule.Ref{Buf: b, Rank: schedule.Rel(rank), Chunk: schedule.Rel(chunk)}
	}
	cp := func(dst, src schedule.Ref) schedule.Step {
		return schedule.Step{Kind: schedule.Copy, Dst: dst, Srcs: []schedule.Ref{src}}
	}
	for _, c := range []struct {
		name  string
		steps []schedule.Step
		want  string
	}{
		{"peer and own", []schedule.Step{cp(ref(schedule.Output, 0, 0), ref(schedule.Input, 0, 0)), cp(ref(schedule.Output, 0, 1), ref(schedule.Stage, 1, 1))}, "[2]"},
		{"own only", []schedule.Step{cp(ref(schedule.Output, 0, 0), ref(schedule.Input, 0, 0)), cp(ref(schedule.Output, 0, 1), ref(schedule.Input, 0, 1))}, "[1 1]"},
		// The second reads what the first writes: order matters.
		{"read after write", []schedule.Step{cp(ref(schedule.Scratch, 0, 1), ref(schedule.Stage, 1, 1)), cp(ref(schedule.Output, 0, 1), ref(schedule.Scratch, 0, 1))}, "[1 1]"},
		// Chunk rank+2 is chunk rank at world 2: both write it.
		{"write after write", []schedule.Step{cp(ref(schedule.Output, 0, 0), ref(schedule.Stage, 1, 0)), cp(ref(schedule.Output, 0, 2), ref(schedule.Stage, 1, 1))}, "[1 1]"},
		{"reduce apart", []schedule.Step{{Kind: schedule.Reduce, Dst: ref(schedule.Output, 0, 0), Srcs: []schedule.Ref{ref(schedule.Stage, 1, 0)}}, cp(ref(schedule.Output, 0, 1), ref(schedule.Stage, 1, 1))}, "[1 1]"},
	} {
		if got := lens(copyGroups(c.steps, 2)); fmt.Sprint(got) != c.want {
			t.Errorf("%s: groups %v, want %s", c.name, got, c.want)
		}
	}
}
