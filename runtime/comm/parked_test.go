package comm

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestParkedGate (reliability case 38): a parked region is freed only
// once no communicator is open on its GPU (other GPUs do not count), and
// a communicator opening on that GPU waits for a free in progress.
func TestParkedGate(t *testing.T) {
	g := newParkedGate()
	g.open(0)
	g.open(1)
	var freed atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- g.free(0, func() error { freed.Store(true); return nil })
	}()
	time.Sleep(20 * time.Millisecond)
	if freed.Load() {
		t.Fatal("freed while a communicator is open on the GPU")
	}
	g.close(0, false) // GPU 1's communicator does not hold GPU 0's region back
	if err := <-done; err != nil || !freed.Load() {
		t.Fatalf("after the last close on GPU 0: freed %v, %v", freed.Load(), err)
	}
	// A free in progress holds back a communicator opening on its GPU.
	release := make(chan struct{})
	go g.free(2, func() error { <-release; return nil })
	time.Sleep(10 * time.Millisecond)
	opened := make(chan struct{})
	go func() { g.open(2); close(opened) }()
	select {
	case <-opened:
		t.Fatal("a communicator opened on the GPU while its parked region was being freed")
	case <-time.After(20 * time.Millisecond):
	}
	// Other GPUs are not held up by it.
	other := make(chan struct{})
	go func() { g.open(3); g.close(3, false); close(other) }()
	select {
	case <-other:
	case <-time.After(5 * time.Second):
		t.Fatal("a free on GPU 2 held up a communicator of GPU 3")
	}
	close(release)
	<-opened
	if g.count(2).live != 1 || g.count(1).live != 1 {
		t.Errorf("live counts %v %v", g.count(1), g.count(2))
	}
}

// TestParkedGateSharing (reliability case 39): a closed communicator's
// frees park only where another communicator of the process is live on
// its GPU and ranks of the process share that GPU's context; with one
// rank per GPU they run at once.
func TestParkedGateSharing(t *testing.T) {
	g := newParkedGate()
	// One rank per GPU, two groups on GPU 0: no kernel of the context
	// waits for a rank of this process.
	g.open(0)
	g.open(0)
	if g.close(0, false) {
		t.Error("parked with one rank of the process on the GPU")
	}
	if g.close(0, false) {
		t.Error("the last communicator on the GPU parked")
	}
	// Two ranks sharing GPU 1 in groups A and B.
	for range 4 {
		g.open(1)
		g.share(1)
	}
	g.open(2) // another GPU does not count
	for i, want := range []bool{true, true, true, false} {
		if got := g.close(1, true); got != want {
			t.Errorf("close %d of the shared communicators: park %v, want %v", i, got, want)
		}
	}
	// A group with one rank on GPU 3 beside a shared one: its frees would
	// hold up the sharing ranks' launches, so they park too.
	g.open(3)
	g.open(3)
	g.share(3)
	g.open(3)
	g.share(3)
	if !g.close(3, false) {
		t.Error("a communicator beside ranks sharing the GPU did not park")
	}
	if g.count(1).sharing != 0 || g.count(2).sharing != 0 || g.count(3).sharing != 2 || g.count(2).live != 1 {
		t.Errorf("counts: %v %v %v", g.count(1), g.count(2), g.count(3))
	}
}

// TestParkedGateDueFirst: frees parked while a GPU was busy run, all of
// them, before another communicator opens there once it empties; parked
// memory does not pile up under communicators that keep opening.
func TestParkedGateDueFirst(t *testing.T) {
	g := newParkedGate()
	g.open(0)
	var freed atomic.Int32
	release := make(chan struct{})
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- g.free(0, func() error { <-release; freed.Add(1); return nil }) }()
	}
	for g.count(0).parked < 2 {
		time.Sleep(time.Millisecond)
	}
	g.close(0, false)
	opened := make(chan struct{})
	go func() { g.open(0); close(opened) }()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-opened:
		t.Fatal("a communicator opened before the frees due on its GPU ran")
	default:
	}
	close(release)
	<-opened
	if n := freed.Load(); n != 2 {
		t.Errorf("opened after %d of 2 due frees", n)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	if c := g.count(0); c != (gpuCounts{live: 1}) {
		t.Errorf("counts: %+v", c)
	}
}

// count is a copy of GPU ordinal's counts (tests).
func (g *parkedGate) count(ordinal int) gpuCounts {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.gpus[ordinal]; c != nil {
		return *c
	}
	return gpuCounts{}
}

// TestParkedGateRandom: communicators of several goroutines open and
// close on two GPUs at random, some sharing their context, and hand the
// frees the gate parks to it, as release does. Whatever the interleaving,
// a free through the gate runs only while no communicator is live on its
// GPU and none opens there until it has finished, and every parked free
// has run once all have closed.
func TestParkedGateRandom(t *testing.T) {
	g := newParkedGate()
	var live [2]atomic.Int32 // communicators the test holds open, by GPU
	var bad atomic.Value
	var parked, freed atomic.Int32
	free := func(gpu int) func() error {
		return func() error {
			if n := live[gpu].Load(); n != 0 {
				bad.Store(fmt.Sprintf("a free on GPU %d ran with %d communicators live", gpu, n))
			}
			time.Sleep(50 * time.Microsecond)
			if n := live[gpu].Load(); n != 0 {
				bad.Store(fmt.Sprintf("a communicator opened on GPU %d during a free", gpu))
			}
			freed.Add(1)
			return nil
		}
	}
	randomWorkers(6, 300, 7, func(rng *rand.Rand) {
		gpu, shared := rng.IntN(2), rng.IntN(3) == 0
		g.open(gpu)
		live[gpu].Add(1)
		if shared {
			g.share(gpu)
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Microsecond)
		live[gpu].Add(-1)
		if g.close(gpu, shared) {
			parked.Add(1)
			go g.free(gpu, free(gpu))
		} else if rng.IntN(4) == 0 { // as Abort's region: through the gate though not parked
			parked.Add(1)
			go g.free(gpu, free(gpu))
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for freed.Load() != parked.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	if freed.Load() != parked.Load() {
		t.Fatalf("%d of %d frees through the gate ran after every communicator closed", freed.Load(), parked.Load())
	}
	if parked.Load() == 0 {
		t.Fatal("no free went through the gate")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.gpus) != 0 {
		t.Errorf("the gate holds counts after everything closed: %v", g.gpus)
	}
}

// randomWorkers runs step rounds times on each of workers goroutines,
// each with its own generator seeded from seed and its index, and returns
// when all are done.
func randomWorkers(workers, rounds int, seed uint64, step func(rng *rand.Rand)) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for range rounds {
				step(rng)
			}
		}()
	}
	wg.Wait()
}
