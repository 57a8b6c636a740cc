package comm

import "sync"

// parkedGate holds back the freeing of an aborted communicator's parked
// staging region (freeWhenLeft) while this process has a live
// communicator on the same GPU. cuMemFree waits for every kernel of the
// context and holds the driver while it waits, so a live communicator's
// kernel waiting for a peer stalls it, and with it Abort's write of the
// abort word that would release that kernel: Abort then returned only at
// the kernel's deadline (docs/reliability.md, case 38). The price: a
// parked region outlives its group while another communicator of the
// process lives on its GPU, and is freed when the last one closes.
type parkedGate struct {
	mu   sync.Mutex
	idle sync.Cond   // on mu: broadcast when a GPU's count drops to 0
	live map[int]int // GPU ordinal -> communicators open on it
}

// newParkedGate returns a gate with no communicator open.
func newParkedGate() *parkedGate {
	g := &parkedGate{live: map[int]int{}}
	g.idle.L = &g.mu
	return g
}

// gpuGate is the process's gate, shared by every communicator.
var gpuGate = newParkedGate()

// open counts a communicator live on GPU ordinal. It waits while a parked
// region of that GPU is being freed, so no kernel of the new communicator
// can start under the free.
func (g *parkedGate) open(ordinal int) {
	g.mu.Lock()
	g.live[ordinal]++
	g.mu.Unlock()
}

// close counts one communicator on GPU ordinal no more.
func (g *parkedGate) close(ordinal int) {
	g.mu.Lock()
	if g.live[ordinal]--; g.live[ordinal] <= 0 {
		delete(g.live, ordinal)
		g.idle.Broadcast()
	}
	g.mu.Unlock()
}

// free calls free once no communicator is live on GPU ordinal, and holds
// the gate while free runs. It returns free's error.
func (g *parkedGate) free(ordinal int, free func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.live[ordinal] > 0 {
		g.idle.Wait()
	}
	return free()
}
