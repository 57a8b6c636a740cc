package host

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Words of a (slot, lane) flag line, as byte offsets into the line. Each
// is written only by the rank that owns the segment; peers only load them.
const (
	lineCounter = 0  // barrier arrivals on this (slot, lane); only grows
	lineSig     = 8  // two words: signatures of the lane's collectives, used in turn (see lane)
	lineSleeper = 24 // 1 + the rank whose counter the owner is blocked on in the kernel; 0 when none
)

// noSig tells wait not to check signatures.
const noSig = -1

// laneMem is what a rank knows about one (slot, lane) of its segment
// between collectives, for lane's reuse rule. Only the runner of the lane
// in the collective holding the slot's lock touches it; the slot's lock and
// the lane claims order successive runners.
type laneMem struct {
	seen  uint64    // every peer's counter on the line is known to be at least this
	freed [2]uint64 // peers are done reading half h of the area once their counters reach freed[h]
	next  int       // the half the next piece of half size uses
	uses  uint64    // collectives that ran on the lane, for the signature word in turn
}

// Budgets of a barrier wait. A waiter first busy-polls the peer's counter
// (only processes with a CPU each: spinning on a shared CPU delays the
// very peer it waits for), then polls while giving its CPU away, then
// blocks on the counter itself until the peer's arrival wakes it: in the
// kernel (a futex) for shared segments, in the Go scheduler (park) for
// goroutine ranks on ordinary memory. So a wait costs at most spinFor of busy CPU and
// yieldFor of yielding, then nothing but a wake-up every blockSlice.
const (
	spinFor  = 20 * time.Microsecond
	yieldFor = 200 * time.Microsecond // from the start of the wait
)

// How often a blocked waiter wakes by itself. These are variables only so
// that tests can lengthen them: then a lost wake-up shows as a timeout
// instead of hiding in a short sleep.
var (
	blockSlice = 5 * time.Millisecond  // longest sleep between looks at ctx, aborts and the deadline
	liveness   = 20 * time.Millisecond // how often a peer's pid is checked
)

// WaitStats counts a rank's barrier waits that found a peer late, by the
// phase in which the peer arrived (see docs/host-backend.md, "Waiting"). A
// wait whose peers had all arrived already is not counted, nor one that
// failed. Counters only grow; compare two readings.
type WaitStats struct {
	Spun    uint64 // the peer came while we busy-polled (the first 20 us; processes with a CPU per lane thread)
	Yielded uint64 // the peer came while we yielded the CPU between looks (up to 200 us from the start)
	Blocked uint64 // the peer came after the yielding: we had announced ourselves and blocked (futex or parked) or were about to
}

// waitPhase is where a slow wait stands: an index into Group.waits.
type waitPhase int

const (
	waitSpin waitPhase = iota
	waitYield
	waitBlock
)

// WaitStats returns this rank's wait counts so far (every lane's, every
// collective's).
func (g *Group) WaitStats() WaitStats {
	return WaitStats{Spun: g.waits[waitSpin].Load(), Yielded: g.waits[waitYield].Load(), Blocked: g.waits[waitBlock].Load()}
}

// arrive publishes this rank's arrival at a barrier of line and wakes any
// peer blocked on it.
//
// Memory ordering. The store of cnt is a release: every write this rank
// made to its Stage/Scratch before it is visible to a peer whose acquire
// load of the counter sees cnt (sync/atomic operations are sequentially
// consistent, which includes acquire and release).
//
// Lost wake-ups. A waiter announces itself by storing our rank+1 into its
// own line's sleeper word, then loads our counter, then sleeps in
// futexWait only if the word still holds the value it loaded. We store the
// counter, then load every peer's sleeper word. Sequential consistency
// orders the four accesses in one total order: if the waiter's load missed
// our store, its announcement precedes our load of the sleeper word, so we
// see it and call futexWake. The wake either finds the waiter queued, or
// comes first, and then the kernel's compare of the word (made atomically
// with queueing, against the value the waiter loaded) fails and the waiter
// does not sleep. Either way no waiter sleeps through an arrival (park
// gives the same guarantee for goroutine ranks). When no peer is
// announced, which is the common case, arriving costs a store and W-1
// loads of lines the barrier reads anyway: no system call, no lock.
func (x *exec) arrive(counter *uint64, line int, cnt uint64) {
	atomic.StoreUint64(counter, cnt)
	me := uint64(x.g.cfg.Rank) + 1
	for p, m := range x.g.mems {
		if p != x.g.cfg.Rank && atomic.LoadUint64(word(m, line+lineSleeper)) == me {
			if x.g.goPark {
				unpark(counter)
			} else {
				futexWake(counter)
			}
			return
		}
	}
}

// phaseStart is the phase wait reports for the start wait of lane: the
// arrivals awaited there are the last ones of the slot's previous
// collective.
const phaseStart = -1

// at names a phase of the collective for errors.
func at(phase int) string {
	if phase == phaseStart {
		return "start (the slot's previous collective)"
	}
	return "phase " + strconv.Itoa(phase)
}

// wait returns once every peer's counter for (slot, lane) reaches target,
// then, unless sigOff is noSig, checks that every peer's signature word at
// sigOff on the line is ours (lane says when a peer at target must be
// running this collective).
func (x *exec) wait(lane, line int, target uint64, sigOff, phase int) error {
	g, w, rank := x.g, x.g.cfg.WorldSize, x.g.cfg.Rank
	for i := 1; i < w; i++ {
		p := (rank + i) % w
		pm := g.mems[p]
		// Acquire load: pairs with the peer's release store in arrive;
		// once it sees target, the peer's Stage/Scratch writes of the
		// phase are visible to our reads in the next phase.
		if atomic.LoadUint64(word(pm, line+lineCounter)) < target {
			if err := x.slowWait(p, line, target, phase, lane); err != nil {
				return err
			}
		}
		if sigOff != noSig {
			if s := atomic.LoadUint64(word(pm, line+sigOff)); s != x.sig {
				return fmt.Errorf("%s %s: rank %d is running a different collective on this slot (tag, kind, dtype, op or count differ, or calls were issued in a different order): %w",
					x.name(), at(phase), p, ErrMismatch)
			}
		}
	}
	return nil
}

// slowWait waits for rank p's counter at line to reach target: spinning,
// then yielding, then blocked on the counter, on a futex or parked (see
// the budgets above, and arrive for the wake-up protocol). Between looks it
// fails on the deadline (Config.Timeout or ctx's, naming the ranks that
// did not arrive), ctx cancellation, the peer's abort or close, the peer's
// death, our own Close, or another lane of this collective failing.
func (x *exec) slowWait(p, line int, target uint64, phase, lane int) error {
	g := x.g
	pm := g.mems[p]
	c := word(pm, line+lineCounter)
	start := time.Now()
	if x.spin {
		for n := 1; ; n++ {
			if atomic.LoadUint64(c) >= target {
				g.waits[waitSpin].Add(1)
				return nil
			}
			spinPause()
			if n&15 == 0 && time.Since(start) >= spinFor {
				break
			}
		}
	}
	deadline, ctxDeadline := start.Add(g.timeout), false
	if d, ok := x.ctx.Deadline(); ok && d.Before(deadline) {
		deadline, ctxDeadline = d, true
	}
	nextLive := start.Add(liveness)
	sleeper := word(g.self.Bytes(), line+lineSleeper)
	announced := false
	defer func() {
		if announced {
			atomic.StoreUint64(sleeper, 0)
		}
	}()
	for {
		v := atomic.LoadUint64(c)
		if v >= target {
			ended := waitYield
			if announced {
				ended = waitBlock
			}
			g.waits[ended].Add(1)
			return nil
		}
		now := time.Now()
		// The deadline first: ctx's, once passed, is a timeout too (both
		// ErrTimeout and context.DeadlineExceeded, naming the missing
		// ranks), not check's bare "context deadline exceeded". ctx's
		// error is asked only when its deadline is the one that counts:
		// its timer may fire a moment before now passes it.
		if now.After(deadline) || ctxDeadline && errors.Is(x.ctx.Err(), context.DeadlineExceeded) {
			missing, took := x.missing(line, target), now.Sub(start).Round(time.Millisecond)
			if ctxDeadline {
				return fmt.Errorf("%s %s lane %d: ranks %v did not reach the barrier by the context's deadline (waited %v): %w: %w",
					x.name(), at(phase), lane, missing, took, ErrTimeout, context.DeadlineExceeded)
			}
			return fmt.Errorf("%s %s lane %d: ranks %v did not reach the barrier within %v: %w",
				x.name(), at(phase), lane, missing, took, ErrTimeout)
		}
		if err := x.check(p, phase); err != nil {
			if atomic.LoadUint64(c) >= target {
				return nil // it arrived, then left
			}
			return err
		}
		if now.After(nextLive) {
			nextLive = now.Add(liveness)
			if pid, dead := x.peerDead(p); dead {
				return fmt.Errorf("%s %s: rank %d (pid %d) died: %w", x.name(), at(phase), p, pid, ErrPeerFailed)
			}
		}
		switch {
		case now.Sub(start) < yieldFor:
			if g.cfg.Shared {
				// Peers are processes: give the CPU to them (Gosched would
				// only switch goroutines of this process).
				osYield()
			}
			runtime.Gosched()
		case !announced:
			// Announce, then look at the word once more before sleeping
			// on it: the order arrive's argument relies on.
			atomic.StoreUint64(sleeper, uint64(p)+1)
			announced = true
		case g.goPark:
			park(c, v, min(blockSlice, deadline.Sub(now)))
		default:
			if err := futexWait(c, v, min(blockSlice, deadline.Sub(now), nextLive.Sub(now))); err != nil {
				return fmt.Errorf("%s %s: waiting for rank %d: %w", x.name(), at(phase), p, err)
			}
		}
	}
}

// check returns why waiting for rank p must stop now, if it must: p
// abandoned the collective or closed the group (unless it arrived first),
// another lane of this collective failed, our group was closed, or ctx
// ended.
func (x *exec) check(p, phase int) error {
	pm := x.g.mems[p]
	// Peer-written words are read with atomic loads; they have a single
	// writer (the peer) and only ever go from 0 to 1.
	if atomic.LoadUint64(hdr(pm, hdrAbort)) != 0 || atomic.LoadUint64(hdr(pm, hdrClosed)) != 0 {
		what := "abandoned the collective"
		if atomic.LoadUint64(hdr(pm, hdrClosed)) != 0 {
			what = "closed the group"
		}
		return fmt.Errorf("%s %s: rank %d %s: %w", x.name(), at(phase), p, what, ErrPeerFailed)
	}
	if x.stop.Load() {
		return errStopped
	}
	if x.g.closed.Load() {
		return fmt.Errorf("%s: %w while waiting", x.name(), ErrClosed)
	}
	if err := x.ctx.Err(); err != nil {
		return fmt.Errorf("%s %s: waiting for rank %d: %w", x.name(), at(phase), p, err)
	}
	return nil
}

// missing lists the ranks whose counter at line is below target.
func (x *exec) missing(line int, target uint64) []int {
	var out []int
	for r, m := range x.g.mems {
		if atomic.LoadUint64(word(m, line+lineCounter)) < target {
			out = append(out, r)
		}
	}
	return out
}

// parked holds the goroutine ranks blocked on a counter word of ordinary
// memory (shm.InProcess segments: every rank in this process sees the word
// at the same address), by the word's address. They block in the Go
// scheduler rather than in a futex, which would hold the goroutine's P
// until sysmon takes it back and starve the other ranks when ranks
// outnumber Ps.
var parked = struct {
	sync.Mutex
	m map[*uint64][]chan struct{}
}{m: map[*uint64][]chan struct{}{}}

// park blocks while *addr == val, for at most d, until unpark(addr). The
// caller has announced itself (sleeper word) before loading val; park
// registers, then loads the word again. An unpark that comes before the
// registration (the mutex orders them) follows the arrival's store, so
// that load sees the arrival and park returns at once; a later unpark
// closes the channel. So no wake-up is lost, as with futexWait.
func park(addr *uint64, val uint64, d time.Duration) {
	ch := make(chan struct{})
	parked.Lock()
	parked.m[addr] = append(parked.m[addr], ch)
	parked.Unlock()
	if atomic.LoadUint64(addr) == val {
		t := time.NewTimer(d)
		select {
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
	parked.Lock()
	defer parked.Unlock()
	chs := parked.m[addr]
	for i, c := range chs {
		if c == ch { // not woken: unregister
			chs[i] = chs[len(chs)-1]
			chs = chs[:len(chs)-1]
			if len(chs) == 0 {
				delete(parked.m, addr)
			} else {
				parked.m[addr] = chs
			}
			break
		}
	}
}

// unpark wakes every goroutine parked on addr.
func unpark(addr *uint64) {
	parked.Lock()
	defer parked.Unlock()
	for _, ch := range parked.m[addr] {
		close(ch)
	}
	delete(parked.m, addr)
}
