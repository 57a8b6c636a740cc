// Package plan expands a validated spec into everything the emitters render:
// every kernel combination with its schedule, launch parameters and argument
// layout, the selection tables and the host reduce loops. All names, offsets
// and orders are computed here, so templates never do arithmetic, and every
// list is sorted, so output bytes are deterministic.
package plan

import (
	"fmt"
	"path"
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

// New expands a spec into a plan.
func New(s *spec.Spec, opts Options) (*Plan, error) {
	if opts.Only != "" {
		if _, err := path.Match(opts.Only, ""); err != nil {
			return nil, fmt.Errorf("--only %q: %w", opts.Only, err)
		}
	}
	p := &Plan{Spec: s, Package: s.Package}
	byName := map[string]*Kernel{}
	layouts := map[int]*Layout{}
	hostKeys := map[kernels.HostKey]bool{}
	for _, t := range s.Topologies {
		for _, c := range coll.Collectives() {
			algs := t.Generate[c]
			if len(algs) > 0 || len(t.Select[c]) > 0 {
				p.Selections = append(p.Selections, selection(&t, c))
			}
			if t.Kind == spec.HostSHM {
				if c.Reduces() && len(algs) > 0 {
					for _, dt := range t.DTypes.Reduce {
						for _, op := range s.Ops {
							hostKeys[kernels.HostKey{DType: dt, Op: op}] = true
						}
					}
				}
				continue
			}
			for _, alg := range algs {
				for _, w := range t.WorldSizes {
					sched, err := schedule.Build(c, alg, w)
					if err != nil {
						return nil, fmt.Errorf("topology %s: %w", t.Name, err)
					}
					for _, dt := range dtypesFor(&t, c) {
						for _, op := range opsFor(s, c) {
							name := KernelName(c, alg, dt, op, w)
							if opts.Only != "" {
								if ok, _ := path.Match(opts.Only, name); !ok {
									continue
								}
							}
							if byName[name] != nil {
								continue
							}
							l := layouts[w]
							if l == nil {
								l = NewLayout(w)
								layouts[w] = l
							}
							k := &Kernel{Name: name, Collective: c, Algorithm: alg, DType: dt, Op: op,
								World: w, Launch: s.Launch(c, alg), Schedule: sched, Layout: l}
							if k.Launch.VectorBytes < dt.Size() {
								k.Launch.VectorBytes = dt.Size()
							}
							byName[name] = k
							p.Kernels = append(p.Kernels, k)
						}
					}
				}
			}
		}
	}
	sort.Slice(p.Kernels, func(i, j int) bool { return p.Kernels[i].Name < p.Kernels[j].Name })
	for _, l := range layouts {
		p.Layouts = append(p.Layouts, l)
	}
	sort.Slice(p.Layouts, func(i, j int) bool { return p.Layouts[i].World < p.Layouts[j].World })
	for k := range hostKeys {
		p.HostReducers = append(p.HostReducers, k)
	}
	sort.Slice(p.HostReducers, func(i, j int) bool {
		a, b := p.HostReducers[i], p.HostReducers[j]
		if a.DType != b.DType {
			return a.DType < b.DType
		}
		return a.Op < b.Op
	})
	p.MaxBlocks = 1
	for _, a := range s.Algorithms {
		if a.Launch.MaxBlocks > p.MaxBlocks {
			p.MaxBlocks = a.Launch.MaxBlocks
		}
	}
	return p, nil
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

func selection(t *spec.Topology, c coll.Collective) kernels.Selection {
	sel := kernels.Selection{Topology: t.Name, Kind: string(t.Kind), Collective: c,
		Worlds: append([]int(nil), t.WorldSizes...)}
	for _, r := range t.Select[c] {
		sel.Rules = append(sel.Rules, kernels.Rule{UpTo: r.UpTo, Use: r.Use})
	}
	if len(sel.Rules) == 0 && t.Kind != spec.HostSHM {
		sel.Rules = []kernels.Rule{{Use: coll.NCCL}}
	}
	return sel
}
