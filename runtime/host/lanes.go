package host

import (
	"errors"
	"sync"
	"sync/atomic"
)

// Lanes of a collective (docs/host-backend.md, "Lanes") are run by whoever
// claims them first: the calling goroutine, which keeps claiming until no
// lane is left, and the group's helpers, Lanes-1 goroutines started with
// the shared memory and blocked on a channel receive while idle. A
// collective of L lanes offers L-1 jobs to the helpers and starts on its
// own lanes at once, so a helper that is slow to wake (a sleeping thread
// whose CPU must be woken first) costs at most the lane the caller would
// have run anyway: the caller never waits for a helper to start, only for
// lanes a helper has started to finish.
//
// Deadlock freedom. Claims hand out lanes 0, 1, ... in order, so the lanes
// claimed on a rank are always a prefix. Take the lowest lane m that some
// rank has not finished. Every rank has finished the lanes below m, so a
// rank where m is unclaimed has every thread that claimed a lane free, its
// caller included, and the caller claims m next. So m is claimed on every
// rank, each claimant runs it, and lane m's barriers (which involve lane m
// only) complete; by induction every lane does. Helpers therefore only
// speed things up, never decide progress: one helper pool serves every
// slot, and a job that finds nothing to claim returns at once.

// MaxLanes bounds Config.Lanes (claims packs lane numbers in 16 bits).
const MaxLanes = 64

// laneJob offers the lanes of slot's collective number gen to a helper.
type laneJob struct {
	slot int
	gen  uint32
}

// claims is the lane hand-out of one slot, for the collective holding the
// slot's lock.
type claims struct {
	// state is gen<<32 | lanes<<16 | next: the collective's number on this
	// slot (so a job left over from an earlier collective claims nothing),
	// its lane count, and the next lane to hand out. The caller stores it
	// after writing the exec (a release); a claim's successful
	// compare-and-swap is the acquire that makes the exec visible to a
	// helper.
	state atomic.Uint64
	gen   uint32       // last collective number; the slot's lock holder only
	left  atomic.Int32 // lanes not finished
	// done carries one token when a helper finishes the collective's last
	// lane; the caller, which then waits, takes it (capacity 1).
	done chan struct{}
	// errs[l] is lane l's error, written by the lane's runner before its
	// decrement of left and read by the caller after left reached 0.
	errs []error
}

// claim hands out the next lane of collective gen, or says none is left.
func (c *claims) claim(gen uint32) (int, bool) {
	for {
		s := c.state.Load()
		next, lanes := int(s&0xffff), int(s>>16&0xffff)
		if uint32(s>>32) != gen || next >= lanes {
			return 0, false
		}
		if c.state.CompareAndSwap(s, s+1) {
			return next, true
		}
	}
}

// helpers is a group's pool of lane helpers.
type helpers struct {
	jobs chan laneJob // buffered: Slots x (Lanes-1), so offering never blocks
	wg   sync.WaitGroup
}

// startHelpers makes the slots' claims and starts Lanes-1 helpers (none
// for one lane). It runs at the end of a successful set-up; stopHelpers
// (from Close) ends them.
func (g *Group) startHelpers() {
	lay := g.lay
	g.claims = make([]claims, lay.Slots)
	for i := range g.claims {
		g.claims[i] = claims{done: make(chan struct{}, 1), errs: make([]error, lay.Lanes)}
	}
	if lay.Lanes == 1 {
		return
	}
	g.help.jobs = make(chan laneJob, lay.Slots*(lay.Lanes-1))
	for i := 1; i < lay.Lanes; i++ {
		g.help.wg.Add(1)
		go func() {
			defer g.help.wg.Done()
			for j := range g.help.jobs {
				if g.runClaimed(j.slot, j.gen) {
					g.claims[j.slot].done <- struct{}{}
				}
			}
		}()
	}
}

// stopHelpers ends the helpers and waits until they have returned. It runs
// when no collective is in flight (Close waits for them first), so no job
// is offered after the channel is closed, and a job still queued claims
// nothing.
func (g *Group) stopHelpers() {
	if g.help.jobs != nil {
		close(g.help.jobs)
		g.help.wg.Wait()
		g.help.jobs = nil
	}
}

// runLanes runs a collective of several lanes (x.lanes > 1): it offers
// x.lanes-1 jobs to the helpers, runs lanes itself until none is left
// to claim, waits for the lanes helpers claimed, and returns the first
// lane error that is not errStopped (errStopped only says another lane
// failed).
func (g *Group) runLanes(x *exec) error {
	c := &g.claims[x.slot]
	clear(c.errs[:x.lanes])
	c.left.Store(int32(x.lanes))
	c.gen++
	// The release that publishes x (and errs, left) to claimants.
	c.state.Store(uint64(c.gen)<<32 | uint64(x.lanes)<<16)
	for i := 1; i < x.lanes; i++ {
		select {
		case g.help.jobs <- laneJob{x.slot, c.gen}:
		default: // the queue is full of other slots' jobs: we run the lane ourselves
		}
	}
	if !g.runClaimed(x.slot, c.gen) {
		<-c.done
	}
	var err error
	for _, e := range c.errs[:x.lanes] {
		if e != nil && (err == nil || errors.Is(err, errStopped)) {
			err = e
		}
	}
	return err
}

// runClaimed runs lanes of slot's collective gen while it can claim one,
// and reports whether it finished the collective's last lane.
func (g *Group) runClaimed(slot int, gen uint32) bool {
	c := &g.claims[slot]
	for {
		l, ok := c.claim(gen)
		if !ok {
			return false
		}
		// The claim's compare-and-swap saw the caller's store of state, so
		// the exec it wrote before is visible, and it stays valid until
		// left reaches 0, which needs our decrement below.
		c.errs[l] = g.execs[slot].runLane(l)
		if c.left.Add(-1) == 0 {
			return true
		}
	}
}
