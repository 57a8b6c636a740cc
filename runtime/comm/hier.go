package comm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
)

// hierDevice is what the hierarchical backend needs from CUDA and NCCL:
// hier_cuda.go implements it (cgo builds), CPU tests fake it. It owns, and
// release frees: the cross-host and all-rank NCCL communicators, the
// scratch buffer, Alloc's buffers (one rank per host), the stream.
type hierDevice interface {
	// openNCCL creates the cross communicator (this rank is crossRank of
	// crossWorld, keyed crossKey) and the communicator over all ranks
	// (rank of world, keyed globalKey); collective over the store.
	openNCCL(ctx context.Context, crossKey string, crossRank, crossWorld int, globalKey string, rank, world int) error
	// nccl enqueues one collective on the cross (cross true) or all-rank
	// communicator, count in NCCL's convention, on s.
	nccl(cross bool, collective coll.Collective, in, out cuda.DevicePtr, count int64, dtype coll.DType, op coll.Op, s *cuda.Stream) error
	// copy enqueues a device-to-device copy of bytes on s.
	copy(dst, src cuda.DevicePtr, bytes int64, s *cuda.Stream) error
	// scratch returns a buffer of at least bytes, valid until the next
	// scratch call; growing it first waits for the device's work.
	scratch(bytes int64) (cuda.DevicePtr, error)
	// alloc returns a plain device buffer freed by release.
	alloc(bytes int) (cuda.DevicePtr, error)
	// synchronize waits for s (nil: the device's own stream), bounded by
	// Config.Timeout: NCCL's kernels across hosts have no deadline.
	synchronize(s *cuda.Stream) error
	// abort makes synchronize return ErrAborted at once and aborts the
	// NCCL communicators (their kernels stop); safe from any goroutine.
	abort()
	// drained waits up to timeout for the device's streams to finish
	// after abort, reporting whether they did.
	drained(timeout time.Duration) bool
	// ncclError returns either communicator's asynchronous error.
	ncclError() error
	cudaDevice() *cuda.Device
	stream() *cuda.Stream
	release() error
}

// hierComm is the backend of a GPU group spanning hosts (hierplan.go has
// the compositions). The host's ranks form a nested single-host
// Communicator (generated kernels, symmetric memory); NCCL connects the
// ranks of one local index across hosts, and all ranks for the rules'
// plain-NCCL sizes.
type hierComm struct {
	cfg    Config
	layout hostLayout
	dev    hierDevice
	intra  *Communicator // the host's ranks; nil with one rank per host
	sels   map[coll.Collective]*kernels.Selection
	calls  *callBook // the calls across hosts, for a diagnosis (calllog.go)
}

// openHier opens the hierarchical backend's device (hier_cuda.go,
// hier_nocgo.go); tests replace it.
var openHier = openHierDevice

// hierRules checks the rules of a group spanning hosts and builds the
// selections: Config.MultiHostRules when set, else the library's (the
// spec's multi_host.select). Every rule names coll.Hierarchical or
// coll.NCCL, and a collective without rules is all hierarchical.
func hierRules(cfg Config) (map[coll.Collective]*kernels.Selection, error) {
	sels := map[coll.Collective]*kernels.Selection{}
	given := cfg.MultiHostRules
	if given == nil && cfg.Library != nil {
		given = map[coll.Collective][]kernels.Rule{}
		for _, s := range cfg.Library.MultiHost {
			given[s.Collective] = s.Rules
		}
	}
	for c, rules := range given {
		if !c.Valid() {
			_, err := coll.ParseCollective(string(c))
			return nil, errorf(ErrInvalidArgument, "comm: Config.MultiHostRules: %w", err)
		}
		for i, r := range rules {
			if r.Use != coll.Hierarchical && r.Use != coll.NCCL {
				return nil, errorf(ErrInvalidArgument, "comm: Config.MultiHostRules[%s][%d] uses %q; a group spanning hosts runs hierarchical or nccl", c, i, r.Use)
			}
			if r.Symmetric {
				return nil, errorf(ErrInvalidArgument, "comm: Config.MultiHostRules[%s][%d] is for symmetric inputs only; rules across hosts apply to every input", c, i)
			}
			if r.UpTo < 0 {
				return nil, errorf(ErrInvalidArgument, "comm: Config.MultiHostRules[%s][%d] has negative UpTo %d", c, i, r.UpTo)
			}
		}
	}
	for _, c := range []coll.Collective{coll.AllReduce, coll.ReduceScatter, coll.AllGather} {
		rules := given[c]
		if len(rules) == 0 {
			rules = []kernels.Rule{{Use: coll.Hierarchical}}
		}
		sels[c] = &kernels.Selection{Topology: "multi_host", Collective: c, Worlds: []int{cfg.WorldSize}, Rules: rules}
	}
	return sels, nil
}

// newHier sets up the hierarchical backend: the nested host communicator
// (collective over the host's ranks), then NCCL across hosts and over all
// ranks (collective over all ranks, in that order on every rank).
func newHier(ctx context.Context, cfg Config, prefix string, l hostLayout, open func(Config) (device, error)) (*hierComm, error) {
	if cfg.Device == Host {
		return nil, errorf(ErrUnsupported, "comm: ranks span %d hosts (%s, ...), but the host backend (Config.Device = comm.Host) runs on one host only; "+
			"run CPU ranks on one host, or give them one Config.HostID", len(l.hosts), l.ids[0])
	}
	if cfg.DisableNCCL {
		return nil, errorf(ErrUnsupported, "comm: ranks span %d hosts and NCCL connects hosts, but Config.DisableNCCL is set", len(l.hosts))
	}
	sels, err := hierRules(cfg)
	if err != nil {
		return nil, err
	}
	h := &hierComm{cfg: cfg, layout: l, sels: sels, calls: newCallBook(cfg, prefix)}
	me, hi := l.local[cfg.Rank], l.host[cfg.Rank]
	if l.perHost() > 1 {
		sub := cfg
		sub.Rank, sub.WorldSize = me, l.perHost()
		sub.Group = cfg.Group + "/host" + strconv.Itoa(hi)
		sub.HostID, sub.MultiHostRules = l.ids[hi], nil
		h.intra, err = newComm(ctx, sub, open)
		// Each host formed its communicator (and voted on its
		// detection) alone: every rank says how that went before NCCL's
		// set-up, which waits for every rank, so that all ranks fail
		// together at once.
		if err = hostsVote(ctx, cfg, prefix, l, err); err != nil {
			return nil, errors.Join(err, h.closeIntra())
		}
	}
	if h.dev, err = openHier(cfg); err != nil {
		return nil, errors.Join(err, h.closeIntra())
	}
	err = h.dev.openNCCL(ctx, crossKey(prefix, me), hi, len(l.hosts), ncclKey(prefix), cfg.Rank, cfg.WorldSize)
	if err != nil {
		// Some ranks may have published their NCCL ids: the last rank to
		// leave forgets them (forgetHierKeys).
		return nil, errors.Join(classify(fmt.Errorf("comm: rank %d: NCCL across hosts: %w", cfg.Rank, err)), h.dev.release(), h.closeIntra())
	}
	return h, nil
}

// hostsVote all-gathers every rank's outcome of its host communicator's
// set-up (mine: nil or why it failed) and returns mine, or, where mine is
// nil and a peer failed, ErrAborted naming the lowest such rank and its
// reason. A rank that failed only tells its peers: it waits for them at
// most hostsVoteTold, then returns its own error whatever they said. The
// exchange is named "detect/view": the group spanning hosts runs no
// detection of its own (its hosts' communicators do), and the group's
// forget already clears that name.
func hostsVote(ctx context.Context, cfg Config, prefix string, l hostLayout, mine error) error {
	why := ""
	if mine != nil {
		why = mine.Error()
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, hostsVoteTold)
		defer cancel()
	}
	all, err := gatherJSON(ctx, cfg.Store, prefix+"detect/view", cfg.Rank, cfg.WorldSize, why, "set-up outcome")
	if mine != nil {
		return mine
	}
	if err != nil {
		return classify(fmt.Errorf("comm: rank %d: exchange set-up outcomes across hosts: %w", cfg.Rank, err))
	}
	for r, w := range all {
		if w != "" {
			return errorf(ErrAborted, "comm: rank %d: rank %d (host %q) failed to set up, so the group spanning hosts cannot form: %s", cfg.Rank, r, l.ids[l.host[r]], w)
		}
	}
	return nil
}

// hostsVoteTold bounds how long a rank whose host communicator failed
// waits in hostsVote: its record is written first, so peers that come
// later still read it.
const hostsVoteTold = 2 * time.Second

func (h *hierComm) closeIntra() error {
	if h.intra == nil {
		return nil
	}
	return h.intra.Close()
}

func (h *hierComm) memory() memKind { return deviceMemory }

func (h *hierComm) rules(collective coll.Collective) *kernels.Selection { return h.sels[collective] }

// symmetricInput: MultiHostRules have no symmetric-input rules (the host
// communicator applies its own to its steps).
func (h *hierComm) symmetricInput(*call) bool { return false }

// prepare refuses what cannot run across hosts: a generated algorithm
// (kernels reach one host), a type or op NCCL lacks, a hierarchical
// all-reduce whose count does not split over the host's ranks, and a
// hierarchical reduce-scatter or all-gather whose scratch (hierPlan:
// WorldSize plus hosts blocks) has more bytes than an int64 holds (the
// automatic choice sends those two to NCCL over all ranks instead).
func (h *hierComm) prepare(cl *call, auto bool) error {
	if _, ok := cl.dtype.NCCL(); !ok {
		return errorf(ErrUnsupported, "comm: %s of %s across hosts: NCCL has no type for %s", cl.collective, cl.dtype, cl.dtype)
	}
	if _, ok := cl.op.NCCL(); cl.collective.Reduces() && !ok {
		return errorf(ErrUnsupported, "comm: %s across hosts: NCCL has no op %s", cl.collective, cl.op)
	}
	L := int64(h.layout.perHost())
	switch {
	case cl.alg == coll.NCCL:
	case cl.alg == coll.Hierarchical && cl.collective == coll.AllReduce && cl.n%L != 0:
		if auto {
			cl.alg = coll.NCCL
			return nil
		}
		return errorf(ErrInvalidArgument, "comm: allreduce with algorithm hierarchical refused: %d elements do not split over the %d ranks of each host; use a multiple of %d or nccl",
			cl.n, L, L)
	case cl.alg == coll.Hierarchical && cl.collective != coll.AllReduce && !h.scratchFits(cl):
		if auto {
			cl.alg = coll.NCCL
			return nil
		}
		return errorf(ErrInvalidArgument, "comm: %s with algorithm hierarchical refused: its scratch of %d x %d %s elements (world size plus hosts) overflows a byte size; use a smaller count or nccl",
			cl.collective, int64(h.cfg.WorldSize+len(h.layout.hosts)), cl.count, cl.dtype)
	case cl.alg == coll.Hierarchical:
	default:
		return errorf(ErrUnsupported, "comm: %s with algorithm %s refused: the ranks span %d hosts and generated kernels reach one host; use hierarchical (they run within each host) or nccl",
			cl.collective, cl.alg, len(h.layout.hosts))
	}
	return nil
}

// scratchFits reports whether the scratch bytes of cl's hierarchical plan
// (reduce-scatter and all-gather: (WorldSize+hosts)*count elements, see
// hierPlan) fit in an int64.
func (h *hierComm) scratchFits(cl *call) bool {
	_, ok := cl.dtype.Bytes(cl.count, int64(h.cfg.WorldSize+len(h.layout.hosts)))
	return ok
}

// run executes a prepared call on one stream (the caller's, else the
// device's own, then waited for): NCCL over all ranks, or the plan's
// steps in order.
func (h *hierComm) run(cl *call) error {
	if err := h.statusErr(); err != nil {
		return err
	}
	s := cl.o.Stream
	if s == nil {
		s = h.dev.stream()
	}
	var err error
	if cl.alg == coll.NCCL {
		err = h.dev.nccl(false, cl.collective, cl.in.dev, cl.out.dev, cl.count, cl.dtype, cl.op, s)
	} else {
		err = h.runPlan(cl, s)
	}
	if err != nil {
		return err
	}
	if cl.o.Stream == nil {
		return h.synchronize(nil)
	}
	return nil
}

// runPlan enqueues the hierarchical steps of cl on s.
func (h *hierComm) runPlan(cl *call, s *cuda.Stream) error {
	steps, tmpElems := hierPlan(h.layout, h.cfg.Rank, cl.collective, cl.count)
	var tmp cuda.DevicePtr
	if tmpElems > 0 {
		var err error
		if tmp, err = h.dev.scratch(tmpElems * cl.esize); err != nil {
			return fmt.Errorf("comm: rank %d: scratch of %d bytes: %w", h.cfg.Rank, tmpElems*cl.esize, err)
		}
	}
	addr := func(sp span) cuda.DevicePtr {
		base := tmp
		switch sp.buf {
		case bufIn:
			base = cl.in.dev
		case bufOut:
			base = cl.out.dev
		}
		return base + cuda.DevicePtr(sp.off*cl.esize)
	}
	// Once begun, every step runs: a host peer whose context is live runs
	// each host step, so one this rank skipped because its Options.Context
	// ended meanwhile would leave that peer waiting until Config.Timeout.
	// The host communicator's own waits stay bounded by Config.Timeout
	// and Abort.
	o := Options{Stream: s}
	if cl.o.Context != nil {
		o.Context = context.WithoutCancel(cl.o.Context)
	}
	for _, st := range steps {
		src, dst := addr(st.src), addr(st.dst)
		var err error
		switch {
		case st.scope == scopeCross:
			err = h.dev.nccl(true, st.collective, src, dst, st.count, cl.dtype, cl.op, s)
		case st.scope == scopeCopy || h.intra == nil:
			// One rank per host: the host's reduce-scatter and
			// all-gather of count elements are copies.
			if src != dst {
				err = h.dev.copy(dst, src, st.count*cl.esize, s)
			}
		case st.collective == coll.ReduceScatter:
			err = h.intra.ReduceScatter(DeviceBuffer(src), DeviceBuffer(dst), int(st.count), cl.dtype, cl.op, o)
		default:
			err = h.intra.AllGather(DeviceBuffer(src), DeviceBuffer(dst), int(st.count), cl.dtype, o)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// statusErr reports a kernel timeout of the host's communicator.
func (h *hierComm) statusErr() error {
	if h.intra == nil {
		return nil
	}
	return h.intra.Err()
}

// synchronize waits for s, then reports a kernel's timeout or NCCL's
// asynchronous error.
func (h *hierComm) synchronize(s *cuda.Stream) error {
	if err := h.dev.synchronize(s); err != nil {
		if errors.Is(err, ErrTimeout) { // NCCL across hosts: no peer named
			if calls := h.calls.diagnoseAll(); calls != "" {
				return errorf(ErrTimeout, "%w; %s", err, calls)
			}
		}
		return err
	}
	if err := h.statusErr(); err != nil {
		return err
	}
	return h.dev.ncclError()
}

// alloc is Communicator.Alloc: symmetric memory among the host's ranks
// (the host's kernels read it in place), a plain buffer with one rank per
// host.
func (h *hierComm) alloc(ctx context.Context, bytes int) (cuda.DevicePtr, error) {
	if h.intra != nil {
		return h.intra.Alloc(ctx, bytes)
	}
	return h.dev.alloc(bytes)
}

// abort stops the backend now (Communicator.Abort): the device's waits
// return and its NCCL communicators are aborted, and the host's
// communicator is aborted (its kernels released, its device torn down).
func (h *hierComm) abort() error {
	h.dev.abort()
	if h.intra == nil {
		return nil
	}
	return h.intra.Abort()
}

// teardown frees the device after abort, once its streams have drained
// (within Config.Timeout; otherwise its memory is left, and the error
// says so: freeing it would wait for the work).
func (h *hierComm) teardown() error {
	if !h.dev.drained(h.cfg.Timeout) {
		return errorf(ErrTimeout, "comm: rank %d: work across hosts still runs %v after Abort; the hierarchical backend's device memory is left allocated", h.cfg.Rank, h.cfg.Timeout)
	}
	return h.dev.release()
}

// close closes the host's communicator (collective over the host) and
// then frees the NCCL communicators and buffers.
func (h *hierComm) close() error {
	serr := h.dev.synchronize(nil)
	return errors.Join(serr, h.closeIntra(), h.dev.release())
}

// spanHosts finishes New for a group whose ranks span hosts: the
// hierarchical backend replaces the single-host ones. On failure the
// rank gives up its claim, so the group name can be formed again.
func (c *Communicator) spanHosts(ctx context.Context, open func(Config) (device, error)) (*Communicator, error) {
	h, err := newHier(ctx, c.cfg, c.prefix, c.layout, open)
	if err != nil {
		var berr error
		if c.b != nil { // the host backend, refused
			berr = c.b.close()
		}
		return nil, errors.Join(classify(err), berr, c.leave())
	}
	c.b, c.hier = h, h
	return c, nil
}
