package cuda

import (
	"fmt"
	"strings"
	"testing"

	"github.com/collgen/collgen/plan"
	"github.com/collgen/collgen/schedule"
	"github.com/collgen/collgen/spec"
)

// unroll is what loop l runs: its body with each loop index evaluated at
// k = 0 .. n-1.
func unroll(l loop) [][]schedule.Step {
	at := func(x schedule.Index, k int) schedule.Index {
		if k0, ok := loopK(x); ok {
			return schedule.Rel(k0 + k)
		}
		return x
	}
	ref := func(r schedule.Ref, k int) schedule.Ref {
		return schedule.Ref{Buf: r.Buf, Rank: at(r.Rank, k), Lane: at(r.Lane, k), Chunk: at(r.Chunk, k)}
	}
	var out [][]schedule.Step
	for k := range l.n {
		g := make([]schedule.Step, len(l.body))
		for s, st := range l.body {
			g[s] = schedule.Step{Kind: st.Kind, Dst: ref(st.Dst, k)}
			for _, r := range st.Srcs {
				g[s].Srcs = append(g[s].Srcs, ref(r, k))
			}
		}
		out = append(out, g)
	}
	return out
}

func sameGroups(a, b [][]schedule.Step) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d groups, want %d", len(a), len(b))
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return fmt.Errorf("group %d: %d steps, want %d", i, len(a[i]), len(b[i]))
		}
		for s := range a[i] {
			x, y := a[i][s], b[i][s]
			same := x.Kind == y.Kind && x.Dst.Equal(y.Dst) && len(x.Srcs) == len(y.Srcs)
			for j := 0; same && j < len(x.Srcs); j++ {
				same = x.Srcs[j].Equal(y.Srcs[j])
			}
			if !same {
				return fmt.Errorf("group %d step %d: %s, want %s", i, s, stepComment(x), stepComment(y))
			}
		}
	}
	return nil
}

// TestLoopsRunTheSchedule: for every kernel of the shipped spec, the loops
// of each phase, unrolled, are the phase's steps (or push groups) in
// order; and the world-8 one-shot phases, W copies of one step, are one
// loop each.
func TestLoopsRunTheSchedule(t *testing.T) {
	s, err := spec.Load("../../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.New(s, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	blocks, loopsSeen := 0, 0
	for _, k := range p.Kernels {
		sch := k.Schedule
		for pi, ph := range sch.Phases {
			groups := singles(ph.Steps)
			if sch.Protocol.Push() {
				groups = llGroups(ph.Steps)
			}
			var got [][]schedule.Step
			ls := loops(groups, sch.World)
			for _, l := range ls {
				got = append(got, unroll(l)...)
				blocks++
				if l.n > 1 {
					loopsSeen++
				}
			}
			if err := sameGroups(got, groups); err != nil {
				t.Fatalf("%s phase %d: %v", k.Name, pi, err)
			}
			if strings.HasPrefix(k.Name, "allreduce_oneshot_f32_sum_w8") && (len(ls) != 1 || ls[0].n != 8) {
				t.Errorf("%s phase %d: %d blocks, want one loop of 8", k.Name, pi, len(ls))
			}
		}
	}
	if loopsSeen == 0 {
		t.Fatal("no loops in the shipped kernels")
	}
	t.Logf("%d kernels: %d blocks, %d of them loops", len(p.Kernels), blocks, loopsSeen)
}

// TestLoopsBreak: a run ends where a buffer, a table index or the shape
// changes, or where the next index would pass W - 1.
func TestLoopsBreak(t *testing.T) {
	copyStep := func(dst, src schedule.Buffer, rank, chunk schedule.Index) []schedule.Step {
		return []schedule.Step{{Kind: schedule.Copy,
			Dst:  schedule.Ref{Buf: dst, Rank: schedule.Self, Chunk: chunk},
			Srcs: []schedule.Ref{{Buf: src, Rank: rank, Chunk: chunk}}}}
	}
	tab := schedule.TableIndex([]int{1, 0, 3, 2})
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
		{"table index", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, tab, schedule.Rel(0)),
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(1), schedule.Rel(1)),
		}, []int{1, 1}},
		{"same table, chunk advances", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, tab, schedule.Rel(0)),
			copyStep(schedule.Output, schedule.Stage, tab, schedule.Rel(1)),
		}, []int{2}},
		{"step of two", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(0), schedule.Rel(0)),
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(2), schedule.Rel(2)),
		}, []int{1, 1}},
		{"past W-1", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(3), schedule.Rel(3)),
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(4), schedule.Rel(4)),
		}, []int{1, 1}},
		{"group sizes differ", [][]schedule.Step{
			copyStep(schedule.Output, schedule.Stage, schedule.Rel(1), schedule.Rel(1)),
			append(copyStep(schedule.Output, schedule.Stage, schedule.Rel(2), schedule.Rel(2)),
				copyStep(schedule.Output, schedule.Stage, schedule.Rel(2), schedule.Rel(2))...),
		}, []int{1, 1}},
	} {
		var got []int
		for _, l := range loops(c.groups, 4) {
			got = append(got, l.n)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: loops of %v, want %v", c.name, got, c.want)
		}
	}
}
