// Package plan expands a validated spec into everything the emitters render:
// every kernel combination with its schedule, launch parameters and argument
// layout, the selection tables and the host reduce loops. All names, offsets
// and orders are computed here, so templates never do arithmetic, and every
// list is sorted, so output bytes are deterministic.
package plan

import (
	"fmt"
	"path"
	"slices"
	"sort"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/schedule"
	"github.com/collgen/collgen/spec"
)

// Plan is the expanded spec.
type Plan struct {
	Spec    *spec.Spec
	Package string
	// Kernels are the GPU kernels, sorted by name.
	Kernels []*Kernel
	// Layouts are the argument layouts, one per world size used by a
	// kernel, sorted by world size.
	Layouts []*Layout
	// Selections are the size rules of every topology and collective, in
	// topology then collective order.
	Selections []kernels.Selection
	// MultiHost are the spec's multi_host rules, in collective order.
	MultiHost []kernels.Selection
	// HostReducers are the (dtype, op) pairs of host reduce loops, sorted.
	HostReducers []kernels.HostKey
	// MaxBlocks is the largest grid any kernel launches; signal pads and
	// sequence counters are sized for it.
	MaxBlocks int
}

// Kernel is one fully specialised GPU kernel.
type Kernel struct {
	Name       string // allreduce_oneshot_bf16_sum_w4: the file stem and the extern "C" symbol
	Collective coll.Collective
	Algorithm  coll.Algorithm
	DType      coll.DType
	Op         coll.Op // empty for all-gather
	World      int
	Launch     spec.Launch
	Schedule   *schedule.Schedule
	Layout     *Layout
}

// File is the kernel's CUDA file name.
func (k *Kernel) File() string { return k.Name + ".cu" }

// VecElems is how many elements one vector load carries.
func (k *Kernel) VecElems() int { return k.Launch.VectorBytes / k.DType.Size() }

// KernelName returns the stable kernel name of a combination.
func KernelName(collective coll.Collective, algorithm coll.Algorithm, dt coll.DType, op coll.Op, world int) string {
	if op == "" {
		return fmt.Sprintf("%s_%s_%s_w%d", collective, algorithm, dt, world)
	}
	return fmt.Sprintf("%s_%s_%s_%s_w%d", collective, algorithm, dt, op, world)
}

// Options narrow a plan.
type Options struct {
	// Only keeps kernels whose name matches this path.Match glob; empty
	// keeps all. Selections and host loops are kept whole.
	Only string
}

// New expands a spec into a plan in named passes, each reading the spec and
// what earlier passes built (as ent's gen.NewGraph builds its graph):
// selections, host reducers, kernels, layouts, then the grid bound.
func New(s *spec.Spec, opts Options) (*Plan, error) {
	if opts.Only != "" {
		if _, err := path.Match(opts.Only, ""); err != nil {
			return nil, fmt.Errorf("--only %q: %w", opts.Only, err)
		}
	}
	b := &builder{s: s, opts: opts, p: &Plan{Spec: s, Package: s.Package}}
	b.selections()
	b.hostReducers()
	if err := b.kernels(); err != nil {
		return nil, err
	}
	b.layouts()
	b.maxBlocks()
	return b.p, nil
}

// builder holds New's input and the plan its passes fill in.
type builder struct {
	s    *spec.Spec
	opts Options
	p    *Plan
}

// selections adds the size rules of every topology and collective that
// generates or selects something, in topology then collective order: one
// selection per distinct rule list, with Worlds the world sizes sharing it
// (in order of their first world size).
func (b *builder) selections() {
	for _, c := range coll.Collectives() {
		if rules, ok := b.s.MultiHost[c]; ok {
			sel := kernels.Selection{Topology: "multi_host", Collective: c}
			for _, r := range rules {
				sel.Rules = append(sel.Rules, kernels.Rule{UpTo: r.UpTo, Use: r.Use})
			}
			b.p.MultiHost = append(b.p.MultiHost, sel)
		}
	}
	for _, t := range b.s.Topologies {
		for _, c := range coll.Collectives() {
			if len(t.Generate[c]) > 0 || len(t.Select[c]) > 0 || len(t.SelectByWorld[c]) > 0 {
				b.p.Selections = append(b.p.Selections, selectionsOf(&t, c)...)
			}
		}
	}
}

// selectionsOf splits the rules of c on t by distinct rule list.
func selectionsOf(t *spec.Topology, c coll.Collective) []kernels.Selection {
	byWorld := t.SelectByWorld[c]
	if len(byWorld) == 0 {
		return []kernels.Selection{selection(t, c, t.WorldSizes, t.Select[c])}
	}
	var out []kernels.Selection
	var lists [][]spec.Rule
	for _, w := range t.WorldSizes {
		rules := byWorld[w]
		i := slices.IndexFunc(lists, func(l []spec.Rule) bool { return slices.Equal(l, rules) })
		if i < 0 {
			lists = append(lists, rules)
			out = append(out, selection(t, c, nil, rules))
			i = len(out) - 1
		}
		out[i].Worlds = append(out[i].Worlds, w)
	}
	return out
}

// hostReducers adds a (dtype, op) loop for every reduce dtype and op of a
// host topology that generates a reducing collective, sorted.
func (b *builder) hostReducers() {
	keys := map[kernels.HostKey]bool{}
	for _, t := range b.s.Topologies {
		if t.Kind != coll.HostSHM {
			continue
		}
		for _, c := range coll.Collectives() {
			if !c.Reduces() || len(t.Generate[c]) == 0 {
				continue
			}
			for _, dt := range t.DTypes.Reduce {
				for _, op := range b.s.Ops {
					keys[kernels.HostKey{DType: dt, Op: op}] = true
				}
			}
		}
	}
	for k := range keys {
		b.p.HostReducers = append(b.p.HostReducers, k)
	}
	sort.Slice(b.p.HostReducers, func(i, j int) bool {
		x, y := b.p.HostReducers[i], b.p.HostReducers[j]
		if x.DType != y.DType {
			return x.DType < y.DType
		}
		return x.Op < y.Op
	})
}

// kernels adds one kernel per (collective, algorithm, world, dtype, op) a
// GPU topology generates and Options.Only keeps, once even when several
// topologies generate it, sorted by name. Layouts are set by the next pass.
func (b *builder) kernels() error {
	byName := map[string]bool{}
	for _, t := range b.s.Topologies {
		if t.Kind == coll.HostSHM {
			continue
		}
		for _, c := range coll.Collectives() {
			for _, alg := range t.Generate[c] {
				for _, w := range t.WorldSizes {
					sched, err := schedule.Build(c, alg, w)
					if err != nil {
						return fmt.Errorf("topology %s: %w", t.Name, err)
					}
					for _, dt := range dtypesFor(&t, c) {
						for _, op := range opsFor(b.s, c) {
							name := KernelName(c, alg, dt, op, w)
							if ok, _ := path.Match(b.opts.Only, name); b.opts.Only != "" && !ok || byName[name] {
								continue
							}
							byName[name] = true
							k := &Kernel{Name: name, Collective: c, Algorithm: alg, DType: dt, Op: op,
								World: w, Launch: b.s.Launch(c, alg), Schedule: sched}
							// A vector holds at least one element.
							k.Launch.VectorBytes = max(k.Launch.VectorBytes, dt.Size())
							b.p.Kernels = append(b.p.Kernels, k)
						}
					}
				}
			}
		}
	}
	sort.Slice(b.p.Kernels, func(i, j int) bool { return b.p.Kernels[i].Name < b.p.Kernels[j].Name })
	return nil
}

// layouts adds one argument layout per world size of a kernel, sorted, and
// points every kernel at its own.
func (b *builder) layouts() {
	byWorld := map[int]*Layout{}
	for _, k := range b.p.Kernels {
		if byWorld[k.World] == nil {
			byWorld[k.World] = NewLayout(k.World)
			b.p.Layouts = append(b.p.Layouts, byWorld[k.World])
		}
		k.Layout = byWorld[k.World]
	}
	sort.Slice(b.p.Layouts, func(i, j int) bool { return b.p.Layouts[i].World < b.p.Layouts[j].World })
}

// maxBlocks sets the largest grid any algorithm of the spec launches (at
// least 1): signal pads and sequence counters are sized for it.
func (b *builder) maxBlocks() {
	b.p.MaxBlocks = 1
	for _, a := range b.s.Algorithms {
		b.p.MaxBlocks = max(b.p.MaxBlocks, a.Launch.MaxBlocks)
	}
}

func dtypesFor(t *spec.Topology, c coll.Collective) []coll.DType {
	if c.Reduces() {
		return t.DTypes.Reduce
	}
	return t.DTypes.Copy
}

func opsFor(s *spec.Spec, c coll.Collective) []coll.Op {
	if c.Reduces() {
		return s.Ops
	}
	return []coll.Op{""}
}

func selection(t *spec.Topology, c coll.Collective, worlds []int, rules []spec.Rule) kernels.Selection {
	sel := kernels.Selection{Topology: t.Name, Kind: t.Kind, Collective: c,
		Worlds: append([]int(nil), worlds...)}
	for _, r := range rules {
		sel.Rules = append(sel.Rules, kernels.Rule{UpTo: r.UpTo, Use: r.Use, Symmetric: r.Symmetric})
	}
	if len(sel.Rules) == 0 && t.Kind != coll.HostSHM {
		sel.Rules = []kernels.Rule{{Use: coll.NCCL}}
	}
	return sel
}
