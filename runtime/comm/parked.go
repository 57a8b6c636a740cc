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
	mu      sync.Mutex
	idle    sync.Cond   // on mu: broadcast when a GPU's count drops to 0
	live    map[int]int // GPU ordinal -> communicators open on it
	sharing map[int]int // GPU ordinal -> those of live whose context another rank of the process shares
	parked  map[int]int // GPU ordinal -> frees waiting for live to drop to 0
	due     map[int]int // GPU ordinal -> of parked, those whose GPU emptied: they run before another opens there
	busy    map[int]int // GPU ordinal -> frees running
}

// newParkedGate returns a gate with no communicator open.
func newParkedGate() *parkedGate {
	g := &parkedGate{live: map[int]int{}, sharing: map[int]int{}, parked: map[int]int{}, due: map[int]int{}, busy: map[int]int{}}
	g.idle.L = &g.mu
	return g
}

// gpuGate is the process's gate, shared by every communicator.
var gpuGate = newParkedGate()

// open counts a communicator live on GPU ordinal. It waits while parked
// memory of that GPU is being freed, or is due to be (parked before the
// GPU emptied), so no kernel of the new communicator can start under the
// free, and parked memory does not pile up under communicators that keep
// opening.
func (g *parkedGate) open(ordinal int) {
	g.mu.Lock()
	for g.due[ordinal] > 0 || g.busy[ordinal] > 0 {
		g.idle.Wait()
	}
	g.live[ordinal]++
	g.mu.Unlock()
}

// share marks one live communicator on GPU ordinal as sharing its CUDA
// context with another rank of this process; its close passes shared.
func (g *parkedGate) share(ordinal int) {
	g.mu.Lock()
	g.sharing[ordinal]++
	g.mu.Unlock()
}

// close counts one communicator on GPU ordinal no more (shared: share was
// called for it) and reports whether its frees that wait for the
// context's kernels must be parked (free): another communicator of the
// process is live on the GPU, and this one or a live one shares the
// context with another rank.
func (g *parkedGate) close(ordinal int, shared bool) (park bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if shared {
		g.sharing[ordinal]--
	}
	g.live[ordinal]--
	park = g.live[ordinal] > 0 && (shared || g.sharing[ordinal] > 0)
	if g.live[ordinal] <= 0 {
		delete(g.live, ordinal)
		delete(g.sharing, ordinal)
		if n := g.parked[ordinal]; n > 0 {
			g.due[ordinal] = n
		}
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
	parked := g.live[ordinal] > 0
	if parked {
		g.parked[ordinal]++
		for g.live[ordinal] > 0 {
			g.idle.Wait()
		}
		if g.parked[ordinal]--; g.parked[ordinal] == 0 {
			delete(g.parked, ordinal)
		}
	}
	g.busy[ordinal]++
	g.mu.Unlock()
	err := free()
	g.mu.Lock()
	if g.busy[ordinal]--; g.busy[ordinal] == 0 {
		delete(g.busy, ordinal)
	}
	if parked { // open waits for every due free
		if g.due[ordinal]--; g.due[ordinal] <= 0 {
			delete(g.due, ordinal)
		}
	}
	g.idle.Broadcast()
	g.mu.Unlock()
	return err
}
