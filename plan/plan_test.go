package plan

import (
	"slices"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/kernels"
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
	only, err := New(s, Options{Only: "allgather_*_w2"})
	if err != nil || len(only.Kernels) == 0 || len(only.Layouts) != 1 || len(only.Selections) != len(p.Selections) {
		t.Errorf("--only: %d kernels, %d layouts, %v", len(only.Kernels), len(only.Layouts), err)
	}
	if _, err := New(s, Options{Only: "[bad"}); err == nil {
		t.Error("a malformed --only glob was accepted")
	}
}
