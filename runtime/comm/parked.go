package comm

import "sync"

// parkedGate decides when a released communicator's device memory and
// modules may be freed. cuMemFree, cuMemFreeHost and cuModuleUnload wait
// for every kernel of the CUDA context (tests/gpu/free_probe.cu), and
// hold the driver for other threads of the context meanwhile (case 38:
// Abort's write of the abort word waited behind it). So a free must not
// run while a kernel of the context may be waiting for a rank of this
// process that the free itself holds up:
//   - an aborted communicator's parked staging region (freeWhenLeft)
//     waits until no communicator of the process is live on its GPU
//     (case 38: a live communicator's kernel waited for the abort word);
//   - a closed or aborted communicator's frees wait likewise where ranks
//     of the process share the GPU's context (case 39: rank 0's kernel of
//     group B waited for rank 1, whose Close of group A freed at once and
//     so waited for that kernel).
//
// With one rank of the process per GPU, a kernel of the context waits
// only for ranks elsewhere, which the free does not hold up: Close frees
// at once. The price where ranks share a GPU: a closed communicator's
// memory is freed when the last communicator of the process on that GPU
// is gone.
type parkedGate struct {
	mu   sync.Mutex
	idle sync.Cond          // on mu: broadcast when a GPU empties or a free ends
	gpus map[int]*gpuCounts // GPU ordinal -> its counts; absent when all are 0
}

// gpuCounts are one GPU's counts in the gate.
type gpuCounts struct {
	live    int // communicators open
	sharing int // of live, those whose context another rank of the process shares
	parked  int // frees waiting for live to drop to 0
	// busy counts frees running, and parked frees released when the GPU
	// emptied: open waits for them all, so no kernel of a new communicator
	// starts under a free and parked memory does not pile up under
	// communicators that keep opening.
	busy int
}

// newParkedGate returns a gate with no communicator open.
func newParkedGate() *parkedGate {
	g := &parkedGate{gpus: map[int]*gpuCounts{}}
	g.idle.L = &g.mu
	return g
}

// gpuGate is the process's gate, shared by every communicator.
var gpuGate = newParkedGate()

// at returns GPU ordinal's counts, made on first use; g.mu held.
func (g *parkedGate) at(ordinal int) *gpuCounts {
	c := g.gpus[ordinal]
	if c == nil {
		c = &gpuCounts{}
		g.gpus[ordinal] = c
	}
	return c
}

// tidy forgets GPU ordinal's counts once all are 0; g.mu held.
func (g *parkedGate) tidy(ordinal int) {
	if c := g.gpus[ordinal]; c != nil && *c == (gpuCounts{}) {
		delete(g.gpus, ordinal)
	}
}

// open counts a communicator live on GPU ordinal. It waits while frees of
// that GPU run or are released to run (gpuCounts.busy).
func (g *parkedGate) open(ordinal int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.at(ordinal).busy > 0 {
		g.idle.Wait()
	}
	g.at(ordinal).live++
}

// share marks one live communicator on GPU ordinal as sharing its CUDA
// context with another rank of this process; its close passes shared.
func (g *parkedGate) share(ordinal int) {
	g.mu.Lock()
	g.at(ordinal).sharing++
	g.mu.Unlock()
}

// close counts one communicator on GPU ordinal no more (shared: share was
// called for it) and reports whether its frees that wait for the
// context's kernels must be parked (free): another communicator of the
// process is live on the GPU, and this one or a live one shares the
// context with another rank. The last one on the GPU releases the parked
// frees.
func (g *parkedGate) close(ordinal int, shared bool) (park bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.at(ordinal)
	if shared {
		c.sharing--
	}
	c.live--
	park = c.live > 0 && (shared || c.sharing > 0)
	if c.live <= 0 {
		c.live, c.sharing = 0, 0
		c.busy += c.parked
		c.parked = 0
		g.tidy(ordinal)
		g.idle.Broadcast()
	}
	return park
}

// free calls free once no communicator is live on GPU ordinal, and keeps
// communicators from opening on that GPU while it runs. The gate's lock
// is not held meanwhile: a free waits for the GPU's kernels, and
// communicators of other GPUs open and close in the meantime. It returns
// free's error.
func (g *parkedGate) free(ordinal int, free func() error) error {
	g.mu.Lock()
	c := g.at(ordinal)
	if c.live > 0 {
		c.parked++ // close moves it to busy when the GPU empties
		for c.live > 0 {
			g.idle.Wait()
		}
	} else {
		c.busy++
	}
	g.mu.Unlock()
	err := free()
	g.mu.Lock()
	c.busy--
	g.tidy(ordinal)
	g.idle.Broadcast()
	g.mu.Unlock()
	return err
}
