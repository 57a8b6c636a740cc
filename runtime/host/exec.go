package host

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/schedule"
)

// minPieceBytes is the smallest piece worth a lane of its own: below it the
// cost of a goroutine hand-off and a barrier outweighs the parallel copy.
// (At 64 KiB, a 128 KiB all-reduce of 4 ranks on 32 CPUs ran in 125 us on
// two lanes against 102 us on one.)
const minPieceBytes = 128 << 10

// call is one collective invocation.
type call struct {
	collective coll.Collective
	in, out    []byte
	count      int // all-reduce: elements; reduce-scatter: per-rank output; all-gather: per-rank input
	dtype      coll.DType
	op         coll.Op
	opts       Options
}

// exec is the state of one collective in flight on this rank. It lives in
// Group.execs[slot], rewritten by each collective that takes the slot's
// lock and cleared when it lets go (so caller buffers are not kept).
type exec struct {
	g       *Group
	c       call
	s       *prepared
	red     kernels.HostReduceFunc
	esz     int
	tag     uint64
	sig     uint64
	slot    int
	lanes   int // lanes used
	pieces  int
	pieceN  int         // all-reduce: elements per piece; others: per-rank elements per piece
	scratch int         // offset of Scratch inside a lane area
	own     bool        // every lane thread of every rank has a CPU (and a P) of its own
	spin    bool        // barrier waits may busy-poll: processes with own CPUs
	stop    atomic.Bool // a lane failed: the others stop waiting
	ctx     context.Context
}

// seqSlot is the slot of every collective with a sequence tag
// (Options.Tag 0). Those are issued in the same order on every rank (the
// sequence's contract), which is all that collectives sharing a slot need,
// and back-to-back collectives on one slot reuse the same Stage and
// Scratch memory and flag lines, which stay in the caches, where rotating
// over the slots touched Slots times as much memory (a 1 MiB all-reduce on
// one goroutine rank ran in about half the time on one slot as over four).
// Explicit tags, for collectives in flight at once, still spread over the
// slots by tag.
const seqSlot = 0

// errStopped is returned by a lane that stopped because another lane of the
// same collective failed; the other lane's error is the one reported.
var errStopped = errors.New("stopped")

func (g *Group) run(ctx context.Context, c call) error {
	if err := g.begin(); err != nil {
		return err
	}
	defer g.active.Done()
	inBytes, outBytes, err := g.check(c)
	if err != nil {
		return err
	}
	var red kernels.HostReduceFunc
	if c.collective.Reduces() {
		var ok bool
		if red, ok = g.lib.HostReducer(c.dtype, c.op); !ok {
			return fmt.Errorf("host %s: %w: library %q has no host reduce loop for %s %s", c.collective, ErrInvalidArgument, g.lib.Package, c.dtype, c.op)
		}
	}
	alg := c.opts.Algorithm
	if alg == coll.Auto {
		if alg, err = g.Algorithm(c.collective, max(inBytes, outBytes)); err != nil {
			return err
		}
	}
	s, err := g.schedule(c.collective, alg)
	if err != nil {
		return err
	}
	if err := g.ensureSetup(ctx); err != nil {
		return err
	}
	// An explicit tag picks its slot; sequence tags all use slot 0 (see
	// seqSlot).
	tag, slot := c.opts.Tag, seqSlot
	if tag == 0 {
		tag = g.seq.Add(1)
	} else {
		slot = int(tag % uint64(g.lay.Slots))
	}
	if c.count == 0 {
		return nil
	}
	if err := g.acquireSlot(ctx, slot); err != nil {
		return fmt.Errorf("%s: %w", callName(g.cfg.Rank, c, alg, tag, slot), err)
	}
	// The slot's lock makes us the only user of execs[slot] on this rank.
	x := &g.execs[slot]
	*x = exec{g: g, c: c, s: s, red: red, esz: c.dtype.Size(), tag: tag, slot: slot, ctx: ctx, sig: signature(tag, c, alg)}
	defer func() {
		*x = exec{}
		<-g.slotLock[slot]
	}()
	x.plan()

	if x.lanes == 1 {
		err = x.lane(0)
	} else {
		err = g.runLanes(x)
	}
	if err != nil {
		g.fail(err)
	}
	return err
}

// runLane runs lane l of a collective with several lanes; when it fails
// it tells the other lanes, which may be waiting for peers that will now
// never come (a failing rank sets its abort word only after all its lanes
// returned). A lane claimed after another failed does not start.
func (x *exec) runLane(l int) error {
	if x.stop.Load() {
		return errStopped
	}
	err := x.lane(l)
	if err != nil {
		x.stop.Store(true)
	}
	return err
}

// check validates a call's arguments before anything is sized from them
// and returns the input and output sizes in bytes. Sizes come from
// coll.DType.Bytes, which refuses a product that overflows, so a huge count is an
// ErrInvalidArgument error, never a wrapped size and a panic.
func (g *Group) check(c call) (inBytes, outBytes int64, err error) {
	bad := func(format string, args ...any) (int64, int64, error) {
		return 0, 0, fmt.Errorf("host %s: %w: %s", c.collective, ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	if !c.dtype.Valid() {
		return bad("unknown dtype %q", c.dtype)
	}
	if c.collective.Reduces() && (!c.op.Valid() || c.dtype.IsFloat8()) {
		return bad("cannot reduce %s with op %q", c.dtype, c.op)
	}
	if c.count < 0 {
		return bad("negative count %d", c.count)
	}
	inF, outF := int64(1), int64(1)
	switch c.collective {
	case coll.ReduceScatter:
		inF = int64(g.cfg.World)
	case coll.AllGather:
		outF = int64(g.cfg.World)
	}
	in, ok1 := c.dtype.Bytes(int64(c.count), inF)
	out, ok2 := c.dtype.Bytes(int64(c.count), outF)
	if !ok1 || !ok2 {
		return bad("%d %s elements overflow a byte size", c.count, c.dtype)
	}
	if int64(len(c.in)) < in || int64(len(c.out)) < out {
		return bad("buffers too small: input has %d bytes, output %d; %d %s elements need %d and %d",
			len(c.in), len(c.out), c.count, c.dtype, in, out)
	}
	for _, b := range [][]byte{c.in, c.out} {
		if len(b) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(c.dtype.Size()) != 0 {
			return bad("buffer is not %d-byte aligned for %s", c.dtype.Size(), c.dtype)
		}
	}
	return in, out, nil
}

// name describes the collective for errors.
func (x *exec) name() string {
	return callName(x.g.cfg.Rank, x.c, x.s.Algorithm, x.tag, x.slot)
}

func callName(rank int, c call, alg coll.Algorithm, tag uint64, slot int) string {
	return fmt.Sprintf("host: rank %d %s %s %s (tag %d, slot %d)", rank, c.collective, alg, c.dtype, tag, slot)
}

// signature identifies a collective on a slot: FNV-1a over its tag,
// kind, algorithm, dtype, op and count, never 0. It runs on every call, so
// it hashes in place rather than formatting a string.
func signature(tag uint64, c call, alg coll.Algorithm) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	num := func(v uint64) {
		for i := 0; i < 8; i++ {
			h = (h ^ v&0xff) * prime
			v >>= 8
		}
	}
	for _, s := range [...]string{string(c.collective), string(alg), string(c.dtype), string(c.op)} {
		num(uint64(len(s)))
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime
		}
	}
	num(tag)
	num(uint64(c.count))
	return h | 1
}

// plan splits the message into pieces that fit a lane's Stage (and
// Scratch) and spreads them round-robin over lanes. Every rank computes the
// same plan from the same arguments and layout.
func (x *exec) plan() {
	lay, w, esz := x.g.lay, x.g.cfg.World, x.esz
	stageBytes := lay.LaneBytes
	if x.s.UsesScratch {
		stageBytes = lay.LaneBytes / 2 / 64 * 64
		x.scratch = stageBytes
	}
	vec := 64 / esz // chunks start on 64-byte boundaries
	stageE := stageBytes / esz
	minE := minPieceBytes / esz
	if x.c.collective == coll.AllReduce {
		unit := w * vec
		maxP := stageE / unit * unit
		p := roundUp((x.c.count+lay.Lanes-1)/lay.Lanes, unit)
		x.pieceN = min(maxP, max(roundUp(minE, unit), p))
	} else {
		maxP := stageE / w / vec * vec
		p := roundUp((x.c.count+lay.Lanes-1)/lay.Lanes, vec)
		x.pieceN = min(maxP, max(roundUp(minE/w, vec), p))
	}
	x.pieces = (x.c.count + x.pieceN - 1) / x.pieceN
	x.lanes = min(lay.Lanes, x.pieces)
	// Busy-polling pays off only when every polling thread has a CPU of
	// its own: World ranks times the lanes each one runs. Counting ranks
	// alone let 8 lanes x 4 ranks spin on 32 CPUs beside the runtime's own
	// threads, so the lane with work to do waited for a CPU.
	threads := w * x.lanes
	x.own = threads <= x.g.cpus
	x.spin = x.own && x.g.cfg.Shared
}

// usableCPUs is how many threads of this process can run at once: the
// CPUs it may run on (runtime.NumCPU, its affinity mask) or the Ps Go
// gives it (GOMAXPROCS, which Go also lowers to a container's CPU quota),
// whichever is fewer. A group reads it once, in New (GOMAXPROCS takes the
// scheduler's lock), and sizes its lanes and the choice to spin from it,
// taking the ranks of a group to share the limit (processes of one
// container, or goroutines of one process): a rank whose lanes outnumber
// its Ps, or ranks that together outnumber the quota, cannot all run at
// once, and a spinning lane then holds the CPU its peer needs.
func usableCPUs() int { return min(runtime.NumCPU(), runtime.GOMAXPROCS(0)) }

// piece is one piece's geometry: all-reduce covers elements [off, off+n)
// in chunks of c; reduce-scatter and all-gather cover [off, off+c) of every
// rank's block, n = World*c.
type piece struct{ off, n, c int }

func (x *exec) piece(p int) piece {
	w := x.g.cfg.World
	lo := p * x.pieceN
	hi := min(lo+x.pieceN, x.c.count)
	if x.c.collective == coll.AllReduce {
		n := hi - lo
		return piece{off: lo, n: n, c: schedule.ChunkElems(coll.AllReduce, n, w, 64/x.esz)}
	}
	return piece{off: lo, n: w * (hi - lo), c: hi - lo}
}

// prepared is a schedule resolved for one rank, once (prepare once, run
// many): every Ref's rank and chunk Index is evaluated, so running a step
// costs no modulo arithmetic. Group.schedule caches it.
type prepared struct {
	*schedule.Schedule
	phases []prepPhase
}

type prepPhase struct {
	steps []prepStep
	sync  bool
}

type prepStep struct {
	kind schedule.StepKind
	dst  prepRef
	srcs []prepRef
}

// prepRef is a schedule.Ref on one rank: buffer, whose (Stage and Scratch
// only) and which chunk.
type prepRef struct {
	buf         schedule.Buffer
	rank, chunk int
}

// prepare resolves s for rank.
func prepare(s *schedule.Schedule, rank int) *prepared {
	w := s.World
	ref := func(r schedule.Ref) prepRef {
		return prepRef{buf: r.Buf, rank: r.Rank.Eval(rank, w), chunk: r.Chunk.Eval(rank, w)}
	}
	ps := &prepared{Schedule: s}
	for _, ph := range s.Phases {
		pp := prepPhase{sync: ph.Sync}
		for _, st := range ph.Steps {
			step := prepStep{kind: st.Kind, dst: ref(st.Dst)}
			for _, r := range st.Srcs {
				step.srcs = append(step.srcs, ref(r))
			}
			pp.steps = append(pp.steps, step)
		}
		ps.phases = append(ps.phases, pp)
	}
	return ps
}

// span resolves a prepared ref to bytes for this piece and lane.
func (x *exec) span(ref prepRef, pc piece, area int) []byte {
	esz := x.esz
	switch ref.buf {
	case schedule.Stage, schedule.Scratch:
		lo, hi := schedule.ChunkRange(ref.chunk, pc.c, pc.n)
		base := area
		if ref.buf == schedule.Scratch {
			base += x.scratch
		}
		return x.g.mems[ref.rank][base+lo*esz : base+hi*esz]
	}
	buf, chunks := x.c.in, x.s.InChunks
	if ref.buf == schedule.Output {
		buf, chunks = x.c.out, x.s.OutChunks
	}
	if x.c.collective == coll.AllReduce {
		lo, hi := schedule.ChunkRange(ref.chunk, pc.c, pc.n)
		return buf[(pc.off+lo)*esz : (pc.off+hi)*esz]
	}
	lo := pc.off
	if chunks > 1 {
		lo += ref.chunk * x.c.count
	}
	return buf[lo*esz : (lo+pc.c)*esz]
}

// lane runs pieces l, l+lanes, ... through every phase of the schedule,
// with its own barrier flags.
//
// What the collective's last barrier guards is this rank's area and
// signature, which peers may still be reading, and the only writer of
// those is the next collective on the same (slot, lane). So that
// collective waits for the last arrivals before its first write (the
// start wait below), and the last barrier itself is waited for only when
// every lane thread has a CPU of its own (x.own): then the wait costs a
// cache-line hand-off and keeps the ranks in step, which measured faster
// for small messages; on shared CPUs every waited barrier risks a
// sleep and a wake-up, and skipping it measured faster. Ranks may differ
// in this (their CPU counts may): either way is safe.
func (x *exec) lane(l int) error {
	g, lay := x.g, x.g.lay
	line := lay.lineOff(x.slot, l)
	area := lay.areaOff(x.slot, l)
	mine := g.self.Bytes()
	counter, sigw := word(mine, line+lineCounter), word(mine, line+lineSig)
	// We are the only writer of our counter, so a plain atomic load gives
	// its current value: the last arrival of the previous collective on
	// this (slot, lane), which every rank makes, so it is everyone's value
	// once they have all finished that collective.
	cnt := atomic.LoadUint64(counter)
	if err := x.wait(l, line, cnt, false, phaseStart); err != nil {
		return err
	}
	// The signature is stored before our first arrival of this collective;
	// a peer reads it only after its acquire load of our counter sees that
	// arrival, so it sees this signature. It cannot see a later one at a
	// barrier that checks it: we store the next only after this start wait
	// of the next collective, i.e. after that peer finished this one.
	atomic.StoreUint64(sigw, x.sig)
	srcs := g.srcs[x.slot*lay.Lanes+l] // ours while we hold the slot
	last := l + (x.pieces-1-l)/x.lanes*x.lanes
	for p := l; p < x.pieces; p += x.lanes {
		pc := x.piece(p)
		for pi, ph := range x.s.phases {
			if testHook != nil && p == 0 {
				g.hook("phase:" + strconv.Itoa(pi))
			}
			for _, st := range ph.steps {
				dst := x.span(st.dst, pc, area)
				if st.kind == schedule.Copy {
					copy(dst, x.span(st.srcs[0], pc, area))
					continue
				}
				srcs = srcs[:0]
				for _, r := range st.srcs {
					srcs = append(srcs, x.span(r, pc, area))
				}
				x.red(dst, srcs)
			}
			if !ph.sync {
				continue
			}
			cnt++
			// Arrive: the release store publishes every write this rank
			// made to its Stage/Scratch in this phase (and earlier) to any
			// peer whose acquire load of this counter sees cnt.
			x.arrive(counter, line, cnt)
			if p == last && pi == len(x.s.phases)-1 {
				// The last barrier (see above): a peer at cnt may already
				// have stored the next collective's signature.
				if x.own {
					if err := x.wait(l, line, cnt, false, pi); err != nil {
						return err
					}
				}
				break
			}
			// A peer whose counter reaches cnt here is in this very
			// collective: it cannot pass a barrier we have not reached,
			// nor start the slot's next collective before our last
			// arrival of this one. So its signature must be ours.
			if err := x.wait(l, line, cnt, true, pi); err != nil {
				return err
			}
		}
	}
	return nil
}

// acquireSlot takes this rank's lock on slot, waiting while an earlier
// collective with a tag of the same residue holds it.
func (g *Group) acquireSlot(ctx context.Context, slot int) error {
	select {
	case g.slotLock[slot] <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(g.timeout)
	defer t.Stop()
	select {
	case g.slotLock[slot] <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the slot: %w", ctx.Err())
	case <-t.C:
		return fmt.Errorf("slot still busy with another collective after %v: %w", g.timeout, ErrTimeout)
	}
}

// peerDead reports whether rank p's process is gone (or a zombie). It only
// knows for processes in our pid namespace; elsewhere it says alive.
func (x *exec) peerDead(p int) (int, bool) {
	if !x.g.cfg.Shared {
		return 0, false
	}
	pm := x.g.mems[p]
	pid := int(atomic.LoadUint64(hdr(pm, hdrPID)))
	ns := atomic.LoadUint64(hdr(pm, hdrPIDNS))
	if pid <= 0 || ns == 0 || ns != x.g.pidNS {
		return pid, false
	}
	return pid, processGone(pid)
}
