package comm

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/host"
	"github.com/collgen/collgen/runtime/kernels"
)

// hostBackend runs resolved calls on host.Group: the algorithm is always
// explicit by the time it gets there, so the group only executes.
type hostBackend struct {
	g     *host.Group
	lib   *kernels.Library
	world int
	// topology is Config.Topology: the host_shm topology whose rules
	// choose ("": the library's first host_shm topology at the world size).
	topology string
}

func (h *hostBackend) memory() memKind { return hostMemory }

// symmetricInput: host buffers are plain memory, never symmetric.
func (h *hostBackend) symmetricInput(*call) bool { return false }

func (h *hostBackend) rules(collective coll.Collective) *kernels.Selection {
	return hostRules(h.lib, h.topology, h.world, collective)
}

// hostRules is the host_shm selection that chooses for collective at world
// size world: topology's ("": the library's first host_shm topology at
// the world size), nil where there is none.
func hostRules(lib *kernels.Library, topology string, world int, collective coll.Collective) *kernels.Selection {
	if topology == "" {
		sel, _ := lib.Selection(coll.HostSHM, collective, world)
		return sel
	}
	for i := range lib.Selections {
		s := &lib.Selections[i]
		if s.Kind == coll.HostSHM && s.Topology == topology && s.Collective == collective && slices.Contains(s.Worlds, world) {
			return s
		}
	}
	return nil
}

// hostRulesNames names, for the membership record, the host_shm topology
// whose rules choose each collective ("-" where none does): ranks that
// name different ones would choose different schedules for one call.
func hostRulesNames(lib *kernels.Library, topology string, world int) string {
	var names []string
	for _, c := range []coll.Collective{coll.AllReduce, coll.ReduceScatter, coll.AllGather} {
		name := "-"
		if s := hostRules(lib, topology, world, c); s != nil {
			name = s.Topology
		}
		names = append(names, string(c)+"="+name)
	}
	return strings.Join(names, " ")
}

// checkHostTopology refuses a Config.Topology that names none of the
// library's host_shm topologies: host ranks run host_shm rules only, and a
// misspelt or GPU topology name was silently ignored.
func checkHostTopology(lib *kernels.Library, name string) error {
	if name == "" {
		return nil
	}
	var names []string
	for _, s := range lib.Selections {
		if s.Kind != coll.HostSHM {
			continue
		}
		if s.Topology == name {
			return nil
		}
		if !slices.Contains(names, s.Topology) {
			names = append(names, s.Topology)
		}
	}
	return errorf(ErrInvalidArgument, "comm: Config.Topology %q is not a host_shm topology of library %q (its host_shm topologies: %v); Device: comm.Host runs host_shm rules only: name one of those, or leave Topology empty", name, lib.Package, names)
}

// prepare refuses what the host cannot run, as host.Group would (so that
// Explain refuses it too): input and output overlapping other than in
// place, a reduction the library has no host reduce loop for, an
// algorithm that is not generated, and a schedule the host cannot build
// or execute (hcm at another world size, LL: host.Group.CanRun).
func (h *hostBackend) prepare(cl *call, auto bool) error {
	if err := h.checkOverlap(cl); err != nil {
		return err
	}
	if cl.collective.Reduces() {
		if err := h.g.CanReduce(cl.collective, cl.dtype, cl.op); err != nil {
			return classify(fmt.Errorf("comm: %w", err))
		}
	}
	if cl.alg.Generated() {
		// host.Group's own check (its schedule cache), so that Explain
		// refuses what the call refuses.
		if err := h.g.CanRun(cl.collective, cl.alg); err != nil {
			return classify(fmt.Errorf("comm: %s with algorithm %s refused: %w", cl.collective, cl.alg, err))
		}
		return nil
	}
	if auto && h.rules(cl.collective) == nil {
		return errorf(ErrUnsupported, "comm: %s of %d bytes: %s; run collgen generate after the spec has it, or name a generated algorithm in Options.Algorithm",
			cl.collective, cl.bytes, h.noRules(cl.collective))
	}
	if auto {
		return errorf(ErrUnsupported, "comm: %s of %d bytes: the host_shm rules select %s, which the host backend cannot run; give the host topology a rule for this size",
			cl.collective, cl.bytes, cl.alg)
	}
	return errorf(ErrUnsupported, "comm: %s with algorithm %s refused: the host backend runs generated schedules only", cl.collective, cl.alg)
}

// checkOverlap refuses input and output that share memory other than in
// the in-place layout, as host.Group does. The text names no rank: the
// debug check compares refusals across ranks.
func (h *hostBackend) checkOverlap(cl *call) error {
	if cl.inBytes == 0 || cl.outBytes == 0 {
		return nil
	}
	if layout, bad := host.OverlapNotInPlace(cl.collective, cl.in.host[:cl.inBytes], cl.out.host[:cl.outBytes], h.g.Rank()); bad {
		return errorf(ErrInvalidArgument, "comm: %s: input and output overlap other than in place (%s): use separate buffers or that layout", cl.collective, layout)
	}
	return nil
}

// noRules says why the library has no host_shm rules for a collective at
// this world size, and what to write in the spec: without them every
// automatic choice would be NCCL, which the host cannot run.
func (h *hostBackend) noRules(collective coll.Collective) string {
	var worlds []int
	var names []string
	for _, s := range h.lib.Selections {
		if s.Kind != coll.HostSHM || (h.topology != "" && s.Topology != h.topology) {
			continue
		}
		if !slices.Contains(names, s.Topology) {
			names = append(names, s.Topology)
		}
		if s.Collective == collective {
			worlds = append(worlds, s.Worlds...)
		}
	}
	switch {
	case len(names) == 0:
		return fmt.Sprintf("library %q has no host_shm topology (its spec has none): add one (kind: host_shm, world_sizes: [1-64], generate and select for each collective; docs/spec.md)", h.lib.Package)
	case len(worlds) == 0:
		return fmt.Sprintf("library %q's host_shm topology %s does not generate %s: add it to its generate: and select:", h.lib.Package, strings.Join(names, ", "), collective)
	}
	slices.Sort(worlds)
	worlds = slices.Compact(worlds)
	ws := make([]string, len(worlds))
	for i, w := range worlds {
		ws[i] = strconv.Itoa(w)
	}
	return fmt.Sprintf("library %q's host_shm topology %s has no world size %d for %s (it has %s): add %d to its world_sizes", h.lib.Package, strings.Join(names, ", "), h.world, collective, strings.Join(ws, ", "), h.world)
}

func (h *hostBackend) run(cl *call) error {
	ctx := cl.o.ctx()
	o := host.Options{Algorithm: cl.alg, Tag: cl.o.Tag}
	switch cl.collective {
	case coll.AllReduce:
		return h.g.AllReduce(ctx, cl.in.host, cl.out.host, int(cl.count), cl.dtype, cl.op, o)
	case coll.ReduceScatter:
		return h.g.ReduceScatter(ctx, cl.in.host, cl.out.host, int(cl.count), cl.dtype, cl.op, o)
	}
	return h.g.AllGather(ctx, cl.in.host, cl.out.host, int(cl.count), cl.dtype, o)
}

func (h *hostBackend) close() error { return h.g.Close() }
