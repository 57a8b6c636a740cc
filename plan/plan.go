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
	Spec    *spec.Spec // the validated spec it was expanded from; not modified
	Package string     // the generated Go package's name (Spec.Package)
	// Kernels are the GPU kernels, sorted by name.
	Kernels []*Kernel
	// Programs are the CUDA programs that run them, sorted by name: one
	// source file and extern "C" function each, shared by the kernels
	// whose code is the same (see Program).
	Programs []*Program
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
	Name       string             // allreduce_oneshot_bf16_sum_w4: its name in the library (Program names the file and symbol)
	Collective coll.Collective    // the collective it runs
	Algorithm  coll.Algorithm     // the algorithm of its schedule
	DType      coll.DType         // element type
	Op         coll.Op            // empty for all-gather
	World      int                // the world size it is specialised for
	Launch     spec.Launch        // the spec's threads, grid bound and vector width (at least one element)
	Schedule   *schedule.Schedule // what it computes; shared with the other dtypes' and ops' kernels: read only
	// PushRounds: a push schedule that may run in rounds
	// (schedule.RoundsSplit, decided once per schedule); the kernel is
	// rendered with the rounds loop and registered with
	// kernels.Kernel.PushRounds. RoundsSplit is the work split its rounds
	// need (schedule.Aligned for a reduce-scatter's or all-gather's
	// one-shot); a kernel that runs in one round keeps the Spread split.
	PushRounds  bool
	RoundsSplit schedule.Split
	Layout      *Layout // its world size's argument struct, shared with Plan.Layouts
	// Program is the compiled program that runs the kernel; several
	// kernels may share it.
	Program *Program
}

// Program is one CUDA source file holding one extern "C" function, which
// runs every kernel in Kernels. Kernels share a program where their code
// would be the same but for a type or a constant:
//
//   - the reduce ops of one reducing kernel (sum, max and min of
//     allreduce_oneshot_bf16_*_w4 are allreduce_oneshot_bf16_w4), unless
//     the spec says op_programs: separate: with more than one op the
//     program takes the op from its arguments (the `op` member,
//     kernels.OpCode) and computes it without a branch (cg_op), so each
//     loop is compiled once instead of once per op;
//   - the dtypes of one element size of a copying kernel (bf16 and f16 of
//     allgather_oneshot_*_w4 are allgather_oneshot_u16_w4): a copy moves
//     bits, never looks at them.
//
// Sharing is what keeps the number of NVRTC compiles, the cold start's
// cost, at a third of the kernel count for the shipped spec.
type Program struct {
	Name    string    // allreduce_oneshot_bf16_w4: the file stem and the extern "C" symbol
	Kernels []*Kernel // the kernels it runs, sorted by name; they differ only in Op or in DType
}

// File is the program's CUDA file name.
func (p *Program) File() string { return p.Name + ".cu" }

// Ops are the reduce ops the program serves, in coll.Ops order (none for
// a copying program). More than one means the op is chosen at run time.
func (p *Program) Ops() []coll.Op {
	var ops []coll.Op
	for _, op := range coll.Ops() {
		if slices.ContainsFunc(p.Kernels, func(k *Kernel) bool { return k.Op == op }) {
			ops = append(ops, op)
		}
	}
	return ops
}

// DTypes are the dtypes of the kernels the program serves, sorted.
func (p *Program) DTypes() []coll.DType {
	var dts []coll.DType
	for _, k := range p.Kernels {
		if !slices.Contains(dts, k.DType) {
			dts = append(dts, k.DType)
		}
	}
	slices.Sort(dts)
	return dts
}

// ProgramName is the name of the program that runs a combination's
// kernel: for a reducing collective the kernel name, without the op when
// op is empty (the ops share the program: spec.SharedOps); for a copying
// one the kernel name with the dtype replaced by its element size (u8,
// u16, u32, u64).
func ProgramName(collective coll.Collective, algorithm coll.Algorithm, dt coll.DType, op coll.Op, world int) string {
	if collective.Reduces() {
		return KernelName(collective, algorithm, dt, op, world)
	}
	return fmt.Sprintf("%s_%s_u%d_w%d", collective, algorithm, 8*dt.Size(), world)
}

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
// selections, host reducers, kernels, programs, layouts, then the grid
// bound.
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
	b.programs()
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
// GPU topology generates, its protocol carries (coll.Protocol.Supports)
// and Options.Only keeps, once even when several
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
					split, pushRounds := schedule.PushRounds(sched)
					for _, dt := range dtypesFor(&t, c) {
						if !sched.Protocol.Supports(dt) {
							continue // Lamport: f16, bf16, f32 only (spec validation refuses a topology with none)
						}
						for _, op := range opsFor(b.s, c) {
							name := KernelName(c, alg, dt, op, w)
							if ok, _ := path.Match(b.opts.Only, name); b.opts.Only != "" && !ok || byName[name] {
								continue
							}
							byName[name] = true
							k := &Kernel{Name: name, Collective: c, Algorithm: alg, DType: dt, Op: op,
								World: w, Launch: b.s.Launch(c, alg), Schedule: sched, PushRounds: pushRounds, RoundsSplit: split}
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

// programs groups the kernels into the programs that run them (see
// Program), sorted by name, and points every kernel at its own.
func (b *builder) programs() {
	byName := map[string]*Program{}
	for _, k := range b.p.Kernels { // sorted by name, so each program's kernels are too
		op := k.Op
		if b.s.OpPrograms != spec.SeparateOps {
			op = "" // the ops share the program
		}
		name := ProgramName(k.Collective, k.Algorithm, k.DType, op, k.World)
		pr := byName[name]
		if pr == nil {
			pr = &Program{Name: name}
			byName[name] = pr
			b.p.Programs = append(b.p.Programs, pr)
		}
		pr.Kernels = append(pr.Kernels, k)
		k.Program = pr
	}
	sort.Slice(b.p.Programs, func(i, j int) bool { return b.p.Programs[i].Name < b.p.Programs[j].Name })
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
