// Package tune turns what collgen learns about a machine into spec text:
// MachineSpec writes a spec whose topologies are the ones a detected
// machine has (for `collgen topo --spec`), and Crossovers turns recorded
// bench sweeps into size rules per topology and world size (for `collgen
// tune`), with a noise margin, a fixed tie order and hysteresis, so that
// differences within the noise do not change the rules. (A crossover that
// sits right at the margin can still move by one size between runs; such
// close calls are flagged, and pooling runs settles them.)
package tune

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/topo"
	"github.com/collgen/collgen/schedule"
	"github.com/collgen/collgen/spec"
)

// ErrNoPeerAccess is returned by MachineSpec for a machine on which no two
// GPUs can access each other: no generated kernel can run there.
var ErrNoPeerAccess = errors.New("no two GPUs of this machine can access each other's memory: no generated kernel can run here; collectives use NCCL")

// SpecOptions tune what MachineSpec writes.
type SpecOptions struct {
	// Base, when not nil, supplies the package name, dtypes, ops, launch
	// parameters and, for each topology, the select rules of the base's
	// first topology of the same kind (rules using algorithms the machine
	// cannot run are dropped; the next rule then covers their sizes); its
	// host_shm topologies are copied as they are. The machine's topologies
	// generate only the collectives the base's dtypes and ops serve (none
	// that reduces where it has no reduce dtypes or no ops).
	Base *spec.Spec
	// BaseName names the base in the file's header comment.
	BaseName string
}

// machineTopology is one topology MachineSpec writes.
type machineTopology struct {
	name     string
	kind     coll.TopologyKind
	worlds   []int
	why      string
	generate map[coll.Collective][]coll.Algorithm
	base     *spec.Topology
}

// algOrder sorts algorithm names barrier first, then LL, then LL128, then
// Lamport, and by name within a protocol (the shipped spec's order; in
// crossovers' near-ties, the longer-proven protocol first).
func algOrder[T ~string](a, b T) int {
	rank := func(s T) int { return slices.Index(coll.Protocols(), coll.Algorithm(s).Protocol()) }
	if ra, rb := rank(a), rank(b); ra != rb {
		return ra - rb
	}
	return strings.Compare(string(a), string(b))
}

// optIn reports whether an algorithm is left out of machine specs: the
// Lamport algorithms, which the shipped spec does not generate either
// until their speed on GPUs of their own is measured
// (tests/gpu/patches/lamport.patch); a spec may still name them.
func optIn(a coll.Algorithm) bool { return a.Protocol() == coll.Lamport }

// machineTopologies finds the spec topologies of m: one per spec kind that
// some set of its GPUs has, with the world sizes at which it does and
// every algorithm that can run at all of them (but the optIn ones).
func machineTopologies(m *topo.Machine, base *spec.Spec) []machineTopology {
	wk := m.WorldKinds()
	byKind := map[coll.TopologyKind]*machineTopology{}
	// Strongest first, so nvlink_full is named after NVSwitch when it has one.
	for _, k := range []topo.Kind{topo.NVSwitch, topo.NVLinkMesh, topo.HybridCubeMesh, topo.PCIe} {
		sk, _ := k.SpecKind()
		lo, hi, _ := schedule.KindWorldSizes(sk)
		var ws []int
		for _, w := range wk[k] {
			if w >= lo && w <= hi {
				ws = append(ws, w)
			}
		}
		if len(ws) == 0 {
			continue
		}
		t := byKind[sk]
		if t == nil {
			name := map[topo.Kind]string{topo.NVSwitch: "nvswitch", topo.NVLinkMesh: "nvlink", topo.HybridCubeMesh: "hcm8", topo.PCIe: "pcie"}[k]
			t = &machineTopology{name: name, kind: sk}
			byKind[sk] = t
		}
		for _, w := range ws {
			if !slices.Contains(t.worlds, w) {
				t.worlds = append(t.worlds, w)
			}
		}
		sort.Ints(t.worlds)
		t.why += fmt.Sprintf("; %s at world sizes %s", k, intList(ws))
	}
	var out []machineTopology
	for _, sk := range coll.TopologyKinds() {
		t := byKind[sk]
		if t == nil {
			continue
		}
		t.why = strings.TrimPrefix(t.why, "; ")
		t.generate = map[coll.Collective][]coll.Algorithm{}
		for _, c := range coll.Collectives() {
			if base != nil && !baseServes(base, c) {
				continue // the spec's checks would refuse its kernels
			}
			for _, a := range schedule.Algorithms(c) {
				if optIn(a) {
					continue
				}
				ok := true
				for _, w := range t.worlds {
					if schedule.CanRun(sk, c, a, w) != nil {
						ok = false
						break
					}
				}
				if ok {
					t.generate[c] = append(t.generate[c], a)
				}
			}
			slices.SortFunc(t.generate[c], algOrder)
		}
		if len(t.generate) == 0 {
			continue // a base whose dtypes and ops allow no collective
		}
		if base != nil {
			for i := range base.Topologies {
				if base.Topologies[i].Kind == sk {
					t.base = &base.Topologies[i]
					break
				}
			}
		}
		out = append(out, *t)
	}
	return out
}

// baseServes reports whether kernels of c have what they need from the
// base's dtypes and ops, which a machine spec takes: reduce dtypes and an
// op for a reducing collective, copy dtypes for all-gather.
func baseServes(base *spec.Spec, c coll.Collective) bool {
	if c.Reduces() {
		return len(base.DTypes.Reduce) > 0 && len(base.Ops) > 0
	}
	return len(base.DTypes.Copy) > 0
}

// intList formats world sizes compactly, "2-4, 8".
func intList(ws []int) string { return strings.Join(spec.WorldRanges(ws), ", ") }

// flowList writes a YAML flow sequence of plain scalars.
func flowList[T any](v []T) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// MachineSpec writes a complete spec for machine m that spec.Load accepts
// as it is: one topology per spec kind that some set of m's GPUs has (named
// nvswitch or nvlink for nvlink_full, hcm8, pcie), listing the world sizes
// at which it has it and generating every algorithm that can run at all of
// them. Select rules come from o.Base where given; without them every
// collective uses NCCL until `collgen tune` measures rules. A machine where
// no GPUs reach each other gets ErrNoPeerAccess.
func MachineSpec(m *topo.Machine, o SpecOptions) ([]byte, error) {
	tops := machineTopologies(m, o.Base)
	if len(tops) == 0 && o.Base != nil && len(machineTopologies(m, nil)) > 0 {
		return nil, fmt.Errorf("%s has no top-level dtypes and ops that a collective's kernels could use (reduce dtypes and ops, or copy dtypes): list some in dtypes and ops", o.BaseName)
	}
	if len(tops) == 0 {
		return nil, ErrNoPeerAccess
	}
	var b strings.Builder
	names := map[string]int{}
	for _, g := range m.GPUs {
		names[g.Name]++
	}
	var gpus []string
	for n, c := range names {
		gpus = append(gpus, fmt.Sprintf("%d x %s", c, n))
	}
	sort.Strings(gpus)
	fmt.Fprintf(&b, "# A collgen spec for this machine, written by `collgen topo --spec`.\n")
	fmt.Fprintf(&b, "# GPUs: %s.\n", strings.Join(gpus, ", "))
	fmt.Fprintf(&b, "# Each topology lists the world sizes at which some set of this machine's\n")
	fmt.Fprintf(&b, "# GPUs is of its kind, and generates every algorithm that runs there.\n")
	if o.Base != nil {
		fmt.Fprintf(&b, "# Package, dtypes, ops, launch parameters, select rules and host_shm\n# topologies: from %s.\n", o.BaseName)
	}
	fmt.Fprintf(&b, "# Measure select rules for this machine with `collgen tune` (docs/topology.md).\n")
	fmt.Fprintf(&b, "version: 1\n")
	pkg := "collectives"
	if o.Base != nil {
		pkg = o.Base.Package
	}
	fmt.Fprintf(&b, "package: %s\n", pkg)
	if o.Base != nil {
		fmt.Fprintf(&b, "dtypes:\n  reduce: %s\n  copy: %s\n", flowList(o.Base.DTypes.Reduce), flowList(o.Base.DTypes.Copy))
		fmt.Fprintf(&b, "ops: %s\n", flowList(o.Base.Ops))
		fmt.Fprintf(&b, "algorithms:\n")
		for _, c := range coll.Collectives() {
			var algs []coll.Algorithm
			add := func(names []coll.Algorithm) {
				for _, a := range names {
					if !slices.Contains(algs, a) {
						algs = append(algs, a)
					}
				}
			}
			for _, t := range tops {
				add(t.generate[c])
			}
			for _, t := range o.Base.Topologies {
				if t.Kind == coll.HostSHM {
					add(t.Generate[c])
				}
			}
			if len(algs) == 0 {
				continue
			}
			slices.Sort(algs)
			fmt.Fprintf(&b, "  %s:\n", c)
			for _, a := range algs {
				l := o.Base.Launch(c, a)
				extra := ""
				if l.MinThreads != 0 {
					extra = fmt.Sprintf(", min_threads: %d", l.MinThreads)
				}
				fmt.Fprintf(&b, "    %s: {threads: %d, max_blocks: %d, vector_bytes: %d%s}\n", a, l.Threads, l.MaxBlocks, l.VectorBytes, extra)
			}
		}
	}
	fmt.Fprintf(&b, "topologies:\n")
	for _, t := range tops {
		fmt.Fprintf(&b, "  %s:  # %s\n", t.name, t.why)
		fmt.Fprintf(&b, "    kind: %s\n", t.kind)
		fmt.Fprintf(&b, "    world_sizes: [%s]\n", intList(t.worlds))
		fmt.Fprintf(&b, "    generate:\n")
		for _, c := range coll.Collectives() {
			if len(t.generate[c]) > 0 {
				fmt.Fprintf(&b, "      %s: %s\n", c, flowList(t.generate[c]))
			}
		}
		if t.base == nil {
			continue
		}
		var sel strings.Builder
		for _, c := range coll.Collectives() {
			if byWorld, ok := t.base.SelectByWorld[c]; ok && t.base.Select[c] == nil {
				// Per world size: the machine's world sizes the base has
				// rules for; the others use NCCL.
				m := map[int][]spec.Rule{}
				for _, w := range t.worlds {
					if rs := usable(byWorld[w], t.generate[c]); len(rs) > 0 {
						m[w] = rs
					}
				}
				if len(m) > 0 {
					fmt.Fprintf(&sel, "      %s:\n%s", c, PerWorldYAML("        ", m))
				}
				continue
			}
			rules := usable(t.base.Select[c], t.generate[c])
			if len(rules) == 0 {
				continue
			}
			fmt.Fprintf(&sel, "      %s:\n%s", c, RulesYAML("        ", rules))
		}
		if sel.Len() > 0 {
			fmt.Fprintf(&b, "    select:  # from %s topology %q\n%s", o.BaseName, t.base.Name, sel.String())
		}
	}
	if o.Base != nil {
		writeHostTopologies(&b, o.Base, o.BaseName)
	}
	return []byte(b.String()), nil
}

// writeHostTopologies copies the base's host_shm topologies (CPU ranks do
// not depend on the GPUs), with their effective dtypes written out.
func writeHostTopologies(b *strings.Builder, base *spec.Spec, baseName string) {
	for _, t := range base.Topologies {
		if t.Kind != coll.HostSHM {
			continue
		}
		fmt.Fprintf(b, "  %s:  # from %s\n", t.Name, baseName)
		fmt.Fprintf(b, "    kind: %s\n    world_sizes: [%s]\n", t.Kind, intList(t.WorldSizes))
		fmt.Fprintf(b, "    dtypes:\n      reduce: %s\n      copy: %s\n", flowList(t.DTypes.Reduce), flowList(t.DTypes.Copy))
		fmt.Fprintf(b, "    generate:\n")
		for _, c := range coll.Collectives() {
			if len(t.Generate[c]) > 0 {
				fmt.Fprintf(b, "      %s: %s\n", c, flowList(t.Generate[c]))
			}
		}
		var sel strings.Builder
		for _, c := range coll.Collectives() {
			if len(t.Select[c]) > 0 {
				fmt.Fprintf(&sel, "      %s:\n%s", c, RulesYAML("        ", t.Select[c]))
			} else if len(t.SelectByWorld[c]) > 0 {
				fmt.Fprintf(&sel, "      %s:\n%s", c, PerWorldYAML("        ", t.SelectByWorld[c]))
			}
		}
		if sel.Len() > 0 {
			fmt.Fprintf(b, "    select:\n%s", sel.String())
		}
	}
}

// usable keeps the rules whose algorithm is generated (or NCCL), merging
// neighbours that end up choosing the same; nil when only NCCL is left.
func usable(rules []spec.Rule, generated []coll.Algorithm) []spec.Rule {
	var out []spec.Rule
	for _, r := range rules {
		if r.Use != coll.NCCL && !slices.Contains(generated, r.Use) {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Use == r.Use && out[n-1].Symmetric == r.Symmetric {
			out[n-1].UpTo = r.UpTo
			continue
		}
		out = append(out, r)
	}
	for _, r := range out {
		if r.Use != coll.NCCL {
			return out
		}
	}
	return nil
}
