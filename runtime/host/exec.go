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

// ntMinBytes is the output size from which copies into the output use
// non-temporal stores (copyNT): an output that large is not read from the
// cache soon, so reading its lines in before overwriting them, which an
// ordinary store does, only adds memory traffic. (On the 32-core GPU host,
// world 4: 64 MiB all-reduce 6.0-6.7 ms against 7.2-7.6, 16 MiB 1.50-1.73
// against 1.59-1.82; at 1-2 MiB, outputs that stay in the caches, no gain
// and at times a loss; docs/host-backend.md.)
const ntMinBytes = 4 << 20

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
	halves  bool        // pieces use the halves of the lane's area in turn (see lane)
	areaB   int         // bytes a piece may use: the lane's area, or half of it
	scratch int         // offset of Scratch inside the bytes a piece uses
	spin    bool        // barrier waits may busy-poll: processes whose lane threads have a CPU each
	nt      bool        // copies into the output use non-temporal stores (ntMinBytes)
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
		if red, err = g.reducer(c.collective, c.dtype, c.op); err != nil {
			return err
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
	// A collective that held the slot while this call waited for it may
	// have failed (it breaks the group before letting the slot go): its
	// peers may still be in it, reading this slot's Stage and counting
	// our arrivals, so running here now would hand them our data as its.
	if err := g.brokenErr(); err != nil {
		<-g.slotLock[slot]
		return err
	}
	// The slot's lock makes us the only user of execs[slot] on this rank.
	x := &g.execs[slot]
	*x = exec{g: g, c: c, s: s, red: red, esz: c.dtype.Size(), tag: tag, slot: slot, ctx: ctx, sig: signature(tag, c, alg)}
	defer func() {
		*x = exec{}
		<-g.slotLock[slot]
	}()
	x.plan()
	x.nt = outBytes >= int64(ntMinBytes)

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
		inF = int64(g.cfg.WorldSize)
	case coll.AllGather:
		outF = int64(g.cfg.WorldSize)
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
	if layout, ok := OverlapNotInPlace(c.collective, c.in[:in], c.out[:out], g.cfg.Rank); ok {
		return bad("input and output overlap other than in place (%s on rank %d): use separate buffers or that layout", layout, g.cfg.Rank)
	}
	return in, out, nil
}

// reducer returns the library's host reduce loop for dtype and op, or an
// error wrapping ErrInvalidArgument saying what the spec must list.
func (g *Group) reducer(collective coll.Collective, dtype coll.DType, op coll.Op) (kernels.HostReduceFunc, error) {
	red, ok := g.lib.HostReducer(dtype, op)
	if !ok {
		return nil, fmt.Errorf("host %s: %w: library %q has no host reduce loop for %s %s: its spec must list %s in dtypes.reduce (the top-level list, or the host_shm topology's own) and %s in the top-level ops, then run collgen generate",
			collective, ErrInvalidArgument, g.lib.Package, dtype, op, dtype, op)
	}
	return red, nil
}

// CanReduce returns nil if the group's library has a host reduce loop for
// dtype and op, else the error a reducing call would return.
func (g *Group) CanReduce(collective coll.Collective, dtype coll.DType, op coll.Op) error {
	_, err := g.reducer(collective, dtype, op)
	return err
}

// OverlapNotInPlace reports whether a collective's input and output (of
// exactly the bytes it reads and writes) share memory other than in the
// in-place layout, which a Group refuses, and names that layout for the
// error. Input and output may share memory only in place: the schedules
// stage a piece's input before writing its output, so an output that runs
// over input of a later piece (or of another lane) would overwrite it
// before it is read.
func OverlapNotInPlace(collective coll.Collective, in, out []byte, rank int) (inPlaceLayout string, refused bool) {
	if len(in) == 0 || len(out) == 0 {
		return "", false
	}
	inP := uintptr(unsafe.Pointer(unsafe.SliceData(in)))
	outP := uintptr(unsafe.Pointer(unsafe.SliceData(out)))
	if inP >= outP+uintptr(len(out)) || outP >= inP+uintptr(len(in)) {
		return "", false
	}
	inPlace := false
	switch collective {
	case coll.AllReduce:
		inPlace, inPlaceLayout = inP == outP, "out == in"
	case coll.ReduceScatter:
		inPlace, inPlaceLayout = outP == inP+uintptr(rank)*uintptr(len(out)), "out = in[Rank*recvCount*size:]"
	case coll.AllGather:
		inPlace, inPlaceLayout = inP == outP+uintptr(rank)*uintptr(len(in)), "in = out[Rank*sendCount*size:]"
	}
	return inPlaceLayout, !inPlace
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
// Scratch) and spreads them round-robin over lanes. When pieces of half
// the lane's area cut the message into no more pieces than pieces of the
// whole area, the collective uses the halves in turn (see lane). Every
// rank computes the same plan from the same arguments and layout.
func (x *exec) plan() {
	lay, w := x.g.lay, x.g.cfg.WorldSize
	pieces := func(n int) int { return (x.c.count + n - 1) / n }
	x.pieceN, x.scratch = x.pieceFor(lay.LaneBytes)
	x.areaB = lay.LaneBytes
	half := lay.LaneBytes / 2 / 64 * 64
	if n, scratch := x.pieceFor(half); n > 0 && pieces(n) == pieces(x.pieceN) {
		x.pieceN, x.halves, x.areaB, x.scratch = n, true, half, scratch
	}
	x.pieces = pieces(x.pieceN)
	x.lanes = min(lay.Lanes, x.pieces)
	// Busy-polling pays off only when every polling thread has a CPU of
	// its own: WorldSize ranks times the lanes each one runs. Counting ranks
	// alone let 8 lanes x 4 ranks spin on 32 CPUs beside the runtime's own
	// threads, so the lane with work to do waited for a CPU.
	x.spin = w*x.lanes <= x.g.cpus && x.g.cfg.Shared
}

// pieceFor returns the elements per piece, and the offset of Scratch, for
// a Stage/Scratch area of areaBytes.
func (x *exec) pieceFor(areaBytes int) (pieceN, scratch int) {
	w, esz, lanes := x.g.cfg.WorldSize, x.esz, x.g.lay.Lanes
	stageBytes := areaBytes
	if x.s.UsesScratch {
		stageBytes = areaBytes / 2 / 64 * 64
		scratch = stageBytes
	}
	vec := 64 / esz // chunks start on 64-byte boundaries
	stageE := stageBytes / esz
	minE := minPieceBytes / esz
	if x.c.collective == coll.AllReduce {
		unit := w * vec
		maxP := stageE / unit * unit
		p := roundUp((x.c.count+lanes-1)/lanes, unit)
		return min(maxP, max(roundUp(minE, unit), p)), scratch
	}
	maxP := stageE / w / vec * vec
	p := roundUp((x.c.count+lanes-1)/lanes, vec)
	return min(maxP, max(roundUp(minE/w, vec), p)), scratch
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
// rank's block, n = WorldSize*c.
type piece struct{ off, n, c int }

func (x *exec) piece(p int) piece {
	w := x.g.cfg.WorldSize
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
// Reuse of our area. Peers read our Stage and Scratch until their arrival
// at a piece's last barrier, and nobody waits for that barrier: a piece
// ends with its last phase. So before a piece writes memory of our area,
// it waits until every peer's counter passed the last barrier of the
// latest piece that used that memory (laneMem.freed), unless an earlier
// wait already saw them there (laneMem.seen). Pieces that fit half the
// area (halves) use the halves in turn; the piece before this one, on
// the other half, had a barrier before its last (schedules have at least
// two, checked in Group.schedule), and our wait there saw every peer past
// the piece before that, the last user of this half. So small collectives
// wait once per barrier but the last, and never at the start; pieces that
// need the whole area wait at the start for the last barrier of the piece
// before.
//
// The signature has two words on the line, used by the lane's collectives
// in turn: a peer may still check our signature at its last waited
// barrier when we start the next collective, but not when we start the one
// after that (we waited for it at a barrier of the one between).
func (x *exec) lane(l int) error {
	g, lay := x.g, x.g.lay
	line := lay.lineOff(x.slot, l)
	area := lay.areaOff(x.slot, l)
	mine := g.self.Bytes()
	lm := &g.laneMem[x.slot*lay.Lanes+l] // ours while we run the lane
	sigOff := lineSig + 8*int(lm.uses%2)
	lm.uses++
	counter := word(mine, line+lineCounter)
	// We are the only writer of our counter, so a plain atomic load gives
	// its current value: our last arrival of the previous piece.
	cnt := atomic.LoadUint64(counter)
	srcs := g.srcs[x.slot*lay.Lanes+l] // ours while we hold the slot
	for p := l; p < x.pieces; p += x.lanes {
		pc := x.piece(p)
		// The piece uses halves [h0, h1) of the area: both, or one in turn.
		base, h0, h1 := area, 0, 2
		if x.halves {
			h0, h1 = lm.next, lm.next+1
			lm.next ^= 1
			base += h0 * x.areaB
		}
		need := max(lm.freed[h0], lm.freed[h1-1])
		if need > lm.seen {
			phase := phaseStart
			if p != l {
				phase = len(x.s.phases) - 1
			}
			if err := x.wait(l, line, need, noSig, phase); err != nil {
				return err
			}
			lm.seen = need
		}
		if p == l {
			// Stored before our first arrival of this collective; a peer
			// reads it only after its acquire load of our counter sees an
			// arrival of this collective (see above for why it is not
			// overwritten too early).
			atomic.StoreUint64(word(mine, line+sigOff), x.sig)
		}
		for pi, ph := range x.s.phases {
			if testHook != nil && p == 0 {
				g.hook("phase:" + strconv.Itoa(pi))
			}
			for _, st := range ph.steps {
				dst := x.span(st.dst, pc, base)
				if st.kind == schedule.Copy {
					if x.nt && st.dst.buf == schedule.Output {
						copyNT(dst, x.span(st.srcs[0], pc, base))
					} else {
						copy(dst, x.span(st.srcs[0], pc, base))
					}
					continue
				}
				srcs = srcs[:0]
				for _, r := range st.srcs {
					srcs = append(srcs, x.span(r, pc, base))
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
			if pi == len(x.s.phases)-1 {
				// The last barrier: peers are done with this piece's
				// memory once they pass it.
				for h := h0; h < h1; h++ {
					lm.freed[h] = cnt
				}
				break
			}
			// A peer whose counter reaches cnt here is in this very
			// collective: it cannot pass a barrier we have not reached,
			// nor start the lane's next collective but one before we
			// pass this one. So its signature must be ours.
			if err := x.wait(l, line, cnt, sigOff, pi); err != nil {
				return err
			}
			lm.seen = cnt
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
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("slot still busy with another collective at the context's deadline: %w: %w", ErrTimeout, ctx.Err())
		}
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
