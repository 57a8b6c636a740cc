package host

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/schedule"
)

// minPieceBytes is the smallest piece worth a lane of its own: below it the
// cost of a goroutine hand-off and a barrier outweighs the parallel copy.
const minPieceBytes = 64 << 10

// call is one collective invocation.
type call struct {
	collective coll.Collective
	in, out    []byte
	count      int // all-reduce: elements; reduce-scatter: per-rank output; all-gather: per-rank input
	dtype      coll.DType
	op         coll.Op
	opts       Options
}

// exec is the state of one collective in flight on this rank.
type exec struct {
	g       *Group
	c       call
	s       *schedule.Schedule
	red     kernels.HostReduceFunc
	esz     int
	tag     uint64
	sig     uint64
	slot    int
	lanes   int // lanes used
	pieces  int
	pieceN  int // all-reduce: elements per piece; others: per-rank elements per piece
	scratch int // offset of Scratch inside a lane area
	stop    atomic.Bool
	ctx     context.Context
}

// errStopped is returned by a lane that stopped because another lane of the
// same collective failed; the other lane's error is the one reported.
var errStopped = errors.New("stopped")

func (g *Group) run(ctx context.Context, c call) error {
	if err := g.begin(); err != nil {
		return err
	}
	defer g.active.Done()
	w := g.cfg.World
	if err := numeric.CheckDType(c.dtype); err != nil {
		return fmt.Errorf("host %s: %w", c.collective, err)
	}
	x := &exec{g: g, c: c, esz: c.dtype.Size(), ctx: ctx}
	if c.collective != coll.AllGather {
		if err := numeric.CheckOp(c.op); err != nil {
			return fmt.Errorf("host %s: %w", c.collective, err)
		}
		red, ok := g.lib.HostReducer(c.dtype, c.op)
		if !ok {
			return fmt.Errorf("host %s: library %q has no host reduce loop for %s %s", c.collective, g.lib.Package, c.dtype, c.op)
		}
		x.red = red
	}
	if c.count < 0 {
		return fmt.Errorf("host %s: negative count %d", c.collective, c.count)
	}
	inE, outE := c.count, c.count
	switch c.collective {
	case coll.ReduceScatter:
		inE = w * c.count
	case coll.AllGather:
		outE = w * c.count
	}
	if len(c.in) < inE*x.esz || len(c.out) < outE*x.esz {
		return fmt.Errorf("host %s: buffers too small: input has %d bytes, output %d; %d %s elements need %d and %d",
			c.collective, len(c.in), len(c.out), c.count, c.dtype, inE*x.esz, outE*x.esz)
	}
	for _, b := range [][]byte{c.in, c.out} {
		if len(b) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(x.esz) != 0 {
			return fmt.Errorf("host %s: buffer is not %d-byte aligned for %s", c.collective, x.esz, c.dtype)
		}
	}
	alg := g.choose(c.collective, int64(max(inE, outE)*x.esz), c.opts.Algorithm)
	s, err := g.schedule(c.collective, alg)
	if err != nil {
		return err
	}
	x.s = s
	if err := g.ensureSetup(ctx); err != nil {
		return err
	}
	x.tag = c.opts.Tag
	if x.tag == 0 {
		x.tag = g.seq.Add(1)
	}
	if c.count == 0 {
		return nil
	}
	x.slot = int(x.tag % uint64(g.lay.Slots))
	x.sig = signature(x.tag, c, alg)
	x.plan()

	if err := x.acquireSlot(); err != nil {
		return err
	}
	defer func() { <-g.slotLock[x.slot] }()

	if x.lanes == 1 {
		err = x.lane(0)
	} else {
		errs := make([]error, x.lanes)
		var wg sync.WaitGroup
		for l := 1; l < x.lanes; l++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[l] = x.lane(l)
			}()
		}
		errs[0] = x.lane(0)
		wg.Wait()
		err = nil
		for _, e := range errs {
			if e != nil && (err == nil || errors.Is(err, errStopped)) {
				err = e
			}
		}
	}
	if err != nil {
		g.fail(err)
	}
	return err
}

// name describes the collective for errors.
func (x *exec) name() string {
	return fmt.Sprintf("host: rank %d %s %s %s (tag %d, slot %d)", x.g.cfg.Rank, x.c.collective, x.s.Algorithm, x.c.dtype, x.tag, x.slot)
}

func signature(tag uint64, c call, alg coll.Algorithm) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d|%s|%s|%s|%s|%d", tag, c.collective, alg, c.dtype, c.op, c.count)
	return h.Sum64() | 1
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
}

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

// span resolves a schedule Ref to bytes for this piece and lane.
func (x *exec) span(ref schedule.Ref, pc piece, area int) []byte {
	g, w, rank, esz := x.g, x.g.cfg.World, x.g.cfg.Rank, x.esz
	ch := ref.Chunk.Eval(rank, w)
	switch ref.Buf {
	case schedule.Stage, schedule.Scratch:
		lo, hi := schedule.ChunkRange(ch, pc.c, pc.n)
		base := area
		if ref.Buf == schedule.Scratch {
			base += x.scratch
		}
		return g.mems[ref.Rank.Eval(rank, w)][base+lo*esz : base+hi*esz]
	}
	buf, chunks := x.c.in, x.s.InChunks
	if ref.Buf == schedule.Output {
		buf, chunks = x.c.out, x.s.OutChunks
	}
	if x.c.collective == coll.AllReduce {
		lo, hi := schedule.ChunkRange(ch, pc.c, pc.n)
		return buf[(pc.off+lo)*esz : (pc.off+hi)*esz]
	}
	lo := pc.off
	if chunks > 1 {
		lo += ch * x.c.count
	}
	return buf[lo*esz : (lo+pc.c)*esz]
}

// lane runs pieces l, l+lanes, ... through every phase of the schedule,
// with its own barrier flags.
func (x *exec) lane(l int) error {
	g, lay := x.g, x.g.lay
	line := lay.lineOff(x.slot, l)
	area := lay.areaOff(x.slot, l)
	mine := g.self.Bytes()
	counter, sigw := word(mine, line), word(mine, line+8)
	// The signature is stored before our first arrival of this collective;
	// a peer reads it only after its acquire load of our counter sees that
	// arrival, so it sees this signature (or a later one, which it only
	// tolerates at the final barrier).
	atomic.StoreUint64(sigw, x.sig)
	// We are the only writer of our counter, so a plain atomic load gives
	// its current value.
	cnt := atomic.LoadUint64(counter)
	srcs := make([][]byte, 0, g.cfg.World)
	last := l + (x.pieces-1-l)/x.lanes*x.lanes
	for p := l; p < x.pieces; p += x.lanes {
		pc := x.piece(p)
		for pi, ph := range x.s.Phases {
			if testHook != nil && p == 0 {
				g.hook("phase:" + strconv.Itoa(pi))
			}
			for _, st := range ph.Steps {
				dst := x.span(st.Dst, pc, area)
				if st.Kind == schedule.Copy {
					copy(dst, x.span(st.Srcs[0], pc, area))
					continue
				}
				srcs = srcs[:0]
				for _, r := range st.Srcs {
					srcs = append(srcs, x.span(r, pc, area))
				}
				x.red(dst, srcs)
			}
			if !ph.Sync {
				continue
			}
			cnt++
			// Arrive: the release store publishes every write this rank
			// made to its Stage/Scratch in this phase (and earlier) to any
			// peer whose acquire load of this counter sees cnt.
			atomic.StoreUint64(counter, cnt)
			final := p == last && pi == len(x.s.Phases)-1
			if err := x.wait(l, line, cnt, !final, pi); err != nil {
				return err
			}
		}
	}
	return nil
}

// wait returns once every peer's counter for (slot, lane) reaches target.
// Counters only grow and a peer cannot pass a barrier we have not reached,
// so at a non-final barrier a peer whose counter reaches target is in this
// very collective: its signature must equal ours. At the final barrier a
// peer may already have moved on to the slot's next collective (and
// rewritten its signature), so the signature is not checked there.
func (x *exec) wait(lane, line int, target uint64, checkSig bool, phase int) error {
	g, w, rank := x.g, x.g.cfg.World, x.g.cfg.Rank
	for i := 1; i < w; i++ {
		p := (rank + i) % w
		pm := g.mems[p]
		c := word(pm, line)
		// Acquire load: pairs with the peer's release store in lane(); once
		// it sees target, the peer's Stage/Scratch writes of the phase are
		// visible to our reads in the next phase.
		if atomic.LoadUint64(c) < target {
			if err := x.slowWait(p, line, target, phase, lane); err != nil {
				return err
			}
		}
		if checkSig {
			if s := atomic.LoadUint64(word(pm, line+8)); s != x.sig {
				return fmt.Errorf("%s phase %d: rank %d is running a different collective on this slot (tag, kind, dtype, op or count differ, or calls were issued in a different order): %w",
					x.name(), phase, p, ErrMismatch)
			}
		}
	}
	return nil
}

// Back-off of a barrier wait: spin with atomic loads, then yield the
// processor to other goroutines, then sleep with growing pauses.
const (
	spinFor  = 20 * time.Microsecond
	yieldFor = 200 * time.Microsecond
	maxSleep = 500 * time.Microsecond
	liveness = 20 * time.Millisecond // how often a peer's pid is checked
)

func (x *exec) slowWait(p, line int, target uint64, phase, lane int) error {
	g := x.g
	pm := g.mems[p]
	c := word(pm, line)
	start := time.Now()
	deadline := start.Add(g.timeout)
	if d, ok := x.ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	spin := spinFor
	if !g.cfg.Shared || g.oversubscribed {
		// Peers are goroutines of this process, or processes competing
		// for too few CPUs: spinning only delays them, so yield at once.
		spin = 0
	}
	nextLive := start.Add(liveness)
	sleep := time.Microsecond
	spinning := spin > 0
	for n := 1; ; n++ {
		if atomic.LoadUint64(c) >= target {
			return nil
		}
		if spinning {
			if n&63 != 0 || time.Since(start) < spin {
				continue
			}
			spinning = false
		}
		now := time.Now()
		// Peer-written words are read with atomic loads; they have a single
		// writer (the peer) and only ever go from 0 to 1.
		if atomic.LoadUint64(hdr(pm, hdrAbort)) != 0 || atomic.LoadUint64(hdr(pm, hdrClosed)) != 0 {
			if atomic.LoadUint64(c) >= target {
				return nil // it arrived, then left
			}
			what := "abandoned the collective"
			if atomic.LoadUint64(hdr(pm, hdrClosed)) != 0 {
				what = "closed the group"
			}
			return fmt.Errorf("%s phase %d: rank %d %s: %w", x.name(), phase, p, what, ErrPeerFailed)
		}
		if x.stop.Load() {
			return errStopped
		}
		if g.closed.Load() {
			return fmt.Errorf("%s: %w while waiting", x.name(), ErrClosed)
		}
		if err := x.ctx.Err(); err != nil {
			return fmt.Errorf("%s phase %d: waiting for rank %d: %w", x.name(), phase, p, err)
		}
		if now.After(nextLive) {
			nextLive = now.Add(liveness)
			if pid, dead := x.peerDead(p); dead {
				return fmt.Errorf("%s phase %d: rank %d (pid %d) died: %w", x.name(), phase, p, pid, ErrPeerFailed)
			}
		}
		if now.After(deadline) {
			return fmt.Errorf("%s phase %d lane %d: ranks %v did not reach the barrier within %v: %w",
				x.name(), phase, lane, x.missing(line, target), now.Sub(start).Round(time.Millisecond), ErrTimeout)
		}
		if now.Sub(start) < yieldFor {
			if g.cfg.Shared {
				// Peers are processes: give the CPU to them (Gosched would
				// only switch goroutines of this process).
				osYield()
			}
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, maxSleep)
	}
}

// missing lists the ranks whose counter at line is below target.
func (x *exec) missing(line int, target uint64) []int {
	var out []int
	for r, m := range x.g.mems {
		if atomic.LoadUint64(word(m, line)) < target {
			out = append(out, r)
		}
	}
	return out
}

// acquireSlot takes this rank's lock on the collective's slot, waiting
// while an earlier collective with a tag of the same residue holds it.
func (x *exec) acquireSlot() error {
	g := x.g
	select {
	case g.slotLock[x.slot] <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(g.timeout)
	defer t.Stop()
	select {
	case g.slotLock[x.slot] <- struct{}{}:
		return nil
	case <-x.ctx.Done():
		return fmt.Errorf("%s: waiting for the slot: %w", x.name(), x.ctx.Err())
	case <-t.C:
		return fmt.Errorf("%s: slot still busy with another collective after %v: %w", x.name(), g.timeout, ErrTimeout)
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
