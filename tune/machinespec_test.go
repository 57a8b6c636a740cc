package tune_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/gen"
	"github.com/collgen/collgen/runtime/topo"
	"github.com/collgen/collgen/runtime/topo/fakenvml"
	"github.com/collgen/collgen/spec"
	"github.com/collgen/collgen/tune"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update rewrites it)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// machine detects a built-in fake machine.
func machine(t *testing.T, name string) *topo.Machine {
	t.Helper()
	m, err := fakenvml.Machine(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMachineSpec(t *testing.T) {
	base, err := spec.Load("testdata/base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := spec.Load("../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// What each machine's spec must hold: topology name -> kind and world
	// sizes.
	want := map[string]string{
		"dgx1":      "hcm8 hybrid_cube_mesh [8]; nvlink nvlink_full [2 3 4]; ",
		"nvswitch8": "nvswitch nvlink_full [2 3 4 5 6 7 8]; ",
		"bridge2":   "nvlink nvlink_full [2]; ",
	}
	for _, name := range []string{"dgx1", "nvswitch8", "bridge2"} {
		m := machine(t, name)
		for _, tc := range []struct {
			suffix string
			opts   tune.SpecOptions
		}{
			{"", tune.SpecOptions{}},
			{"-base", tune.SpecOptions{Base: base, BaseName: "testdata/base.yaml"}},
			{"-shipped", tune.SpecOptions{Base: shipped, BaseName: "spec/collgen.yaml"}},
		} {
			out, err := tune.MachineSpec(m, tc.opts)
			if err != nil {
				t.Fatalf("%s%s: %v", name, tc.suffix, err)
			}
			// The real loader must accept what topo emits, as it is.
			s, err := spec.Parse(name+".yaml", out)
			if err != nil {
				t.Fatalf("%s%s: the emitted spec does not load:\n%v\n%s", name, tc.suffix, err, out)
			}
			got, host := "", ""
			for _, tp := range s.Topologies {
				if tp.Kind == coll.HostSHM {
					host = fmt.Sprintf("%s %v %v %v", tp.Name, tp.WorldSizes[len(tp.WorldSizes)-1], tp.DTypes.Reduce, tp.Select[coll.AllReduce])
					continue
				}
				got += fmt.Sprintf("%s %s %v; ", tp.Name, tp.Kind, tp.WorldSizes)
			}
			// With a base, its host topology comes along unchanged.
			wantHost := ""
			if bt := findKind(tc.opts.Base, coll.HostSHM); bt != nil {
				wantHost = fmt.Sprintf("%s %v %v %v", bt.Name, bt.WorldSizes[len(bt.WorldSizes)-1], bt.DTypes.Reduce, bt.Select[coll.AllReduce])
				for _, a := range s.Algorithms {
					if a.Launch != tc.opts.Base.Launch(a.Collective, a.Name) {
						t.Errorf("%s%s: %s %s launch %+v, base %+v", name, tc.suffix, a.Collective, a.Name, a.Launch, tc.opts.Base.Launch(a.Collective, a.Name))
					}
				}
			}
			if host != wantHost {
				t.Errorf("%s%s: host topology %q, want %q", name, tc.suffix, host, wantHost)
			}
			if got != want[name] {
				t.Errorf("%s%s: topologies %q, want %q", name, tc.suffix, got, want[name])
			}
			if tc.suffix != "-shipped" { // the shipped spec may change; the frozen base does not
				golden(t, filepath.Join("machinespec", name+tc.suffix+".yaml"), out)
			}
			if tc.opts.Base == nil {
				continue
			}
			// With a base, its select rules carry over where the algorithms run.
			for _, tp := range s.Topologies {
				bt := findKind(tc.opts.Base, tp.Kind)
				if bt == nil {
					continue
				}
				for c, rules := range bt.Select {
					if len(tp.Select[c]) == 0 && usesKernel(rules) {
						t.Errorf("%s%s: topology %s lost its %s rules", name, tc.suffix, tp.Name, c)
					}
				}
			}
		}
	}
}

// findKind returns s's first topology of kind k (nil for a nil s).
func findKind(s *spec.Spec, k coll.TopologyKind) *spec.Topology {
	if s == nil {
		return nil
	}
	for i := range s.Topologies {
		if s.Topologies[i].Kind == k {
			return &s.Topologies[i]
		}
	}
	return nil
}

// usesKernel reports whether some rule picks a generated kernel.
func usesKernel(rules []spec.Rule) bool {
	for _, r := range rules {
		if r.Use != coll.NCCL {
			return true
		}
	}
	return false
}

func TestMachineSpecNoPeers(t *testing.T) {
	_, err := tune.MachineSpec(machine(t, "pcie4"), tune.SpecOptions{})
	if !errors.Is(err, tune.ErrNoPeerAccess) {
		t.Errorf("pcie4: %v", err)
	}
}

// TestMachineSpecRenders: the generator renders every kernel of what topo
// writes for the DGX-1 (with the frozen base), in memory.
func TestMachineSpecRenders(t *testing.T) {
	base, err := spec.Load("testdata/base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := tune.MachineSpec(machine(t, "dgx1"), tune.SpecOptions{Base: base, BaseName: "base.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse("dgx1.yaml", out)
	if err != nil {
		t.Fatal(err)
	}
	r, err := gen.Render(s, gen.Options{ImportPath: "example.com/machine/generated"})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	if len(r.Plan.Kernels) == 0 {
		t.Fatal("no kernels")
	}
	t.Logf("%d files, %d kernels", len(r.Files), len(r.Plan.Kernels))
}

// A base that selects per world size passes its rules on per world size:
// the machine's world sizes it has rules for, host_shm topologies whole.
func TestMachineSpecPerWorldBase(t *testing.T) {
	base, err := spec.Parse("perworld.yaml", []byte(`version: 1
package: collectives
topologies:
  nvswitch:
    kind: nvlink_full
    world_sizes: [2-4, 8]
    generate:
      allreduce: [oneshot, twoshot]
    select:
      allreduce:
        2: [{upto: 1MiB, use: oneshot}]
        3-4: [{upto: 64KiB, use: oneshot}, {upto: 8MiB, use: twoshot}]
        8: [{upto: 2MiB, use: twoshot}]
  host:
    kind: host_shm
    world_sizes: [1-4]
    generate:
      allreduce: [oneshot, twoshot]
    select:
      allreduce:
        1-2: [{use: oneshot}]
        3-4: [{upto: 1MiB, use: oneshot}, {use: twoshot}]
`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := tune.MachineSpec(machine(t, "nvswitch8"), tune.SpecOptions{Base: base, BaseName: "perworld.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse("machine.yaml", out)
	if err != nil {
		t.Fatalf("the emitted spec does not load:\n%v\n%s", err, out)
	}
	for _, tc := range []struct {
		topo string
		w    int
		n    int64
		want coll.Algorithm
	}{
		{"nvswitch", 2, 1 << 20, coll.OneShot},
		{"nvswitch", 3, 1 << 20, coll.TwoShot},
		{"nvswitch", 4, 1 << 10, coll.OneShot},
		{"nvswitch", 5, 1 << 10, coll.NCCL}, // not in the base
		{"nvswitch", 8, 1 << 20, coll.TwoShot},
		{"host", 2, 1 << 30, coll.OneShot},
		{"host", 4, 1 << 30, coll.TwoShot},
	} {
		tp := s.Topology(tc.topo)
		if tp == nil {
			t.Fatalf("no topology %s:\n%s", tc.topo, out)
		}
		if got := tp.ChooseFor(coll.AllReduce, tc.w, tc.n); got != tc.want {
			t.Errorf("%s world %d, %d bytes: %q, want %q\n%s", tc.topo, tc.w, tc.n, got, tc.want, out)
		}
	}
}
