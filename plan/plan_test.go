package plan

import (
	"slices"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/schedule"
	"github.com/collgen/collgen/spec"
)

// TestNewPasses checks what each pass of New promises on the shipped spec.
func TestNewPasses(t *testing.T) {
	s, err := spec.Load("../spec")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	worlds := map[int]bool{}
	for i, k := range p.Kernels {
		if i > 0 && p.Kernels[i-1].Name >= k.Name {
			t.Errorf("kernels not sorted and unique at %s", k.Name)
		}
		if k.Layout == nil || k.Layout.World != k.World {
			t.Errorf("%s has layout %v", k.Name, k.Layout)
		}
		if k.Launch.MaxBlocks > p.MaxBlocks || k.Launch.VectorBytes < k.DType.Size() {
			t.Errorf("%s launch %+v, plan max blocks %d", k.Name, k.Launch, p.MaxBlocks)
		}
		// The runtime derives the aligned split from what it registers
		// (kernels.Kernel.AlignedRounds); it must agree with the plan's.
		rk := kernels.Kernel{Collective: k.Collective, Protocol: k.Schedule.Protocol, PushRounds: k.PushRounds}
		if aligned := k.PushRounds && k.RoundsSplit == schedule.Aligned; rk.AlignedRounds() != aligned {
			t.Errorf("%s: plan's aligned rounds %v, runtime's %v", k.Name, aligned, rk.AlignedRounds())
		}
		if want := k.Schedule.Protocol.Push() && k.World > 1 && (k.Collective == coll.AllReduce || k.Schedule.Protocol == coll.LL128); want && !k.PushRounds {
			t.Errorf("%s: a push kernel without rounds", k.Name)
		}
		worlds[k.World] = true
	}
	if len(p.Layouts) != len(worlds) || !slices.IsSortedFunc(p.Layouts, func(a, b *Layout) int { return a.World - b.World }) {
		t.Errorf("%d layouts for %d world sizes", len(p.Layouts), len(worlds))
	}
	if len(p.HostReducers) != 18 || p.HostReducers[0] != (kernels.HostKey{DType: coll.BF16, Op: coll.Max}) {
		t.Errorf("host reducers %v", p.HostReducers)
	}
	if len(p.Selections) == 0 || p.Selections[0].Topology != s.Topologies[0].Name {
		t.Errorf("selections do not follow topology order: %v", p.Selections)
	}
	if len(p.Kernels) != 393 || len(p.Programs) != 147 {
		t.Errorf("%d kernels in %d programs, want the shipped spec's 393 in 147", len(p.Kernels), len(p.Programs))
	}
	only, err := New(s, Options{Only: "allgather_*_w2"})
	if err != nil || len(only.Kernels) == 0 || len(only.Layouts) != 1 || len(only.Selections) != len(p.Selections) {
		t.Errorf("--only: %d kernels, %d layouts, %v", len(only.Kernels), len(only.Layouts), err)
	}
	if _, err := New(s, Options{Only: "[bad"}); err == nil {
		t.Error("a malformed --only glob was accepted")
	}
}

// TestPrograms checks how kernels share programs: the ops of one reducing
// kernel share one, the dtypes of one element size of a copying kernel
// share one, and nothing else does (a program's kernels have one
// collective, algorithm, world, launch and schedule, and reducing ones one
// dtype).
func TestPrograms(t *testing.T) {
	s, err := spec.Load("../spec")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, pr := range p.Programs {
		if i > 0 && p.Programs[i-1].Name >= pr.Name {
			t.Errorf("programs not sorted and unique at %s", pr.Name)
		}
		k0 := pr.Kernels[0]
		for _, k := range pr.Kernels {
			n++
			if k.Program != pr {
				t.Errorf("%s is in %s but points at %v", k.Name, pr.Name, k.Program)
			}
			if k.Collective != k0.Collective || k.Algorithm != k0.Algorithm || k.World != k0.World ||
				k.Launch != k0.Launch || k.Schedule != k0.Schedule || k.DType.Size() != k0.DType.Size() ||
				k.Collective.Reduces() && k.DType != k0.DType {
				t.Errorf("program %s runs %s and %s, which differ in more than op or dtype", pr.Name, k0.Name, k.Name)
			}
		}
		if k0.Collective.Reduces() && len(pr.Ops()) != len(pr.Kernels) {
			t.Errorf("program %s: %d kernels for ops %v", pr.Name, len(pr.Kernels), pr.Ops())
		}
	}
	if n != len(p.Kernels) {
		t.Errorf("programs run %d kernels, the plan has %d", n, len(p.Kernels))
	}
	want := map[string][]string{
		"allreduce_oneshot_bf16_w4":   {"allreduce_oneshot_bf16_max_w4", "allreduce_oneshot_bf16_min_w4", "allreduce_oneshot_bf16_sum_w4"},
		"allgather_oneshot_ll_u16_w2": {"allgather_oneshot_ll_bf16_w2", "allgather_oneshot_ll_f16_w2"},
		"allgather_oneshot_u8_w8":     {"allgather_oneshot_e4m3_w8", "allgather_oneshot_e5m2_w8"},
		"allgather_oneshot_u32_w3":    {"allgather_oneshot_f32_w3"},
	}
	for _, pr := range p.Programs {
		if w, ok := want[pr.Name]; ok {
			var got []string
			for _, k := range pr.Kernels {
				got = append(got, k.Name)
			}
			if !slices.Equal(got, w) {
				t.Errorf("program %s runs %v, want %v", pr.Name, got, w)
			}
			delete(want, pr.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("programs missing: %v", want)
	}
	// op_programs: separate: one program per op, named as its kernel.
	s.OpPrograms = spec.SeparateOps
	sep, err := New(s, Options{})
	if err != nil || len(sep.Programs) != 369 {
		t.Fatalf("op_programs: separate: %d programs, %v; want 333 reducing kernels' own and 36 copying", len(sep.Programs), err)
	}
	for _, pr := range sep.Programs {
		if k := pr.Kernels[0]; k.Collective.Reduces() && (len(pr.Kernels) != 1 || pr.Name != k.Name) {
			t.Errorf("op_programs: separate: program %s runs %d kernels, the first %s", pr.Name, len(pr.Kernels), k.Name)
		}
	}
	s.OpPrograms = spec.SharedOps
	// --only keeps the programs of the kernels it keeps, serving only them.
	only, err := New(s, Options{Only: "allreduce_oneshot_bf16_sum_*"})
	if err != nil || len(only.Programs) != 4 || !slices.Equal(only.Programs[0].Ops(), []coll.Op{coll.Sum}) {
		t.Errorf("--only: %d programs, %v", len(only.Programs), err)
	}
}
