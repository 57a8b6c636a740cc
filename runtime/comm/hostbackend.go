package comm

import (
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
}

func (h *hostBackend) memory() memKind { return hostMemory }

// symmetricInput: host buffers are plain memory, never symmetric.
func (h *hostBackend) symmetricInput(*call) bool { return false }

func (h *hostBackend) rules(collective coll.Collective) *kernels.Selection {
	sel, _ := h.lib.Selection(coll.HostSHM, collective, h.world)
	return sel
}

// prepare refuses what the host cannot run at all; a schedule the host
// cannot execute (hcm, LL) is refused by host.Group with the reason.
func (h *hostBackend) prepare(cl *call, auto bool) error {
	if cl.alg.Generated() {
		return nil
	}
	if auto {
		return errorf(ErrUnsupported, "comm: %s of %d bytes: the host_shm rules select %s, which the host backend cannot run; give the host topology a rule for this size",
			cl.collective, cl.bytes, cl.alg)
	}
	return errorf(ErrUnsupported, "comm: %s with algorithm %s refused: the host backend runs generated schedules only", cl.collective, cl.alg)
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
