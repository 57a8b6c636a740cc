package proof

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestBackToBackGPU (reliability case 97): goroutine ranks issue 64
// all-reduces of each push algorithm back to back on a stream of their
// own and wait once. With every rank on one GPU (COLLGEN_TEST_SHARE_GPU),
// early launch put the blocks of each rank's next kernel on the SMs while
// a peer's kernel still needed them, and the kernels waited for each
// other until Config.Timeout (worlds 3, 4 and 8 on one H100, `collgen
// bench --devices 0,0,0`); a rank whose context holds another rank of the
// group now launches plainly. With a GPU per rank it runs world 2 (or
// every GPU's world) with early launch, as shipped.
//
// The ranks' first calls start at once, each from an OS thread of its own
// with the context current: first works of new streams racing each other
// in one context left one rank's kernels queued behind a peer's until the
// deadline (case 99; eight ranks on one H100 timed out so in 23 of 31
// runs before cuda.Stream serialised first works).
func TestBackToBackGPU(t *testing.T) {
	ngpu := proofGPUs(t)
	for _, w := range []int{2, 3, 4, 8} {
		if w > ngpu || (!sharedGPU() && w != ngpu) {
			continue
		}
		t.Run(fmt.Sprintf("w%d", w), func(t *testing.T) {
			comms := commsWith(t, w, rendezvous.NewMemStore(), func(int) comm.Config {
				return comm.Config{Library: collectives.Library, DisableNCCL: true, Timeout: 10 * time.Second, Group: fmt.Sprintf("back-to-back-%d", w)}
			})
			defer closeComms(comms)
			const n = 128 << 10 // bf16 elements: 256 KiB
			bufs := make([]cuda.DevicePtr, w)
			streams := make([]*cuda.Stream, w)
			// Allocate before any rank launches: an allocation may wait for
			// the context's kernels (reliability case 39).
			if err := ranks(comms, func(r int, c *comm.Communicator) (err error) {
				d := c.Device()
				if bufs[r], err = d.Alloc(2 * n); err != nil {
					return err
				}
				streams[r], err = d.NewStream()
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer ranks(comms, func(r int, c *comm.Communicator) error {
				return errors.Join(streams[r].Destroy(), c.Device().Free(bufs[r]))
			})
			// Every rank's goroutine on a thread of its own with the
			// context current, released at once for its first call.
			var ready sync.WaitGroup
			ready.Add(w)
			release := make(chan struct{})
			go func() { ready.Wait(); close(release) }()
			first := true // the first ranks() below; read by its goroutines, set after it returns
			for _, alg := range []coll.Algorithm{coll.OneShotLL, coll.OneShotLL128, coll.TwoShotLL128} {
				for _, count := range []int{32 << 10, n} {
					start := time.Now()
					// Where a rank is 8 s into the 10 s deadline: every
					// goroutine's stack, so a stalled host call shows.
					stacks := stacksAfter(t, 8*time.Second, fmt.Sprintf("%s, %d bf16: still running after 8s", alg, count))
					err := ranks(comms, func(r int, c *comm.Communicator) error {
						if first {
							runtime.LockOSThread()
							defer runtime.UnlockOSThread()
							_, err := c.Device().StackBytes() // the context current here
							ready.Done()
							<-release
							if err != nil {
								return err
							}
						}
						o := comm.Options{Algorithm: alg, Stream: streams[r]}
						b := comm.DeviceBuffer(bufs[r])
						for i := 0; i < 64; i++ {
							if err := c.AllReduce(b, b, count, coll.BF16, coll.Sum, o); err != nil {
								return fmt.Errorf("rank %d: call %d: %w", r, i, err)
							}
						}
						return c.Synchronize(streams[r])
					})
					stacks.Stop()
					first = false
					if err != nil {
						t.Fatalf("%s, %d bf16, 64 back to back: %v", alg, count, err)
					}
					t.Logf("%s, %d bf16: 64 back to back in %v", alg, count, time.Since(start))
				}
			}
		})
	}
}

// TestStackReservedGPU (reliability case 99): where goroutine ranks share a
// GPU, New grows the context's local memory for the group's kernels, so no
// collective's launch grows it (a growth waits for every kernel of the
// context, peers' kernels waiting for this one included). World 8's LL
// one-shots have a stack frame; one call of each push algorithm, each
// waited for alone, must leave the reservation as New made it. Without
// the reservation the first LL one-shot grew it (1024 to 2304 bytes a
// thread on one H100) and, back to back, most runs timed out.
func TestStackReservedGPU(t *testing.T) {
	if !sharedGPU() {
		t.Skip("needs ranks sharing a GPU (COLLGEN_TEST_SHARE_GPU=1): with a context of its own a rank lets its first launch grow the reservation")
	}
	const w = 8
	if proofGPUs(t) < w {
		t.Skip("needs world 8")
	}
	comms := commsWith(t, w, rendezvous.NewMemStore(), func(int) comm.Config {
		return comm.Config{Library: collectives.Library, DisableNCCL: true, Timeout: 10 * time.Second, Group: "stack-reserved"}
	})
	defer closeComms(comms)
	dev := comms[0].Device()
	reserved, err := dev.StackBytes()
	if err != nil {
		t.Fatal(err)
	}
	const n = 32 << 10
	bufs := make([]cuda.DevicePtr, w)
	if err := ranks(comms, func(r int, c *comm.Communicator) (err error) {
		bufs[r], err = c.Device().Alloc(2 * n)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ranks(comms, func(r int, c *comm.Communicator) error { return c.Device().Free(bufs[r]) })
	for _, alg := range []coll.Algorithm{coll.OneShotLL, coll.OneShotLL128, coll.TwoShotLL128} {
		if err := allReduceAlone(comms, bufs, nil, n, alg); err != nil {
			t.Fatalf("%s: %v", alg, err)
		}
		now, err := dev.StackBytes()
		if err != nil {
			t.Fatal(err)
		}
		if now != reserved {
			t.Fatalf("%s's launch grew the context's local memory from %d to %d bytes a thread: New did not reserve it", alg, reserved, now)
		}
	}
	t.Logf("New reserved %d bytes of local memory a thread; no launch grew it", reserved)
}

// allReduceAlone has every rank make one in-place bf16 sum all-reduce of
// n elements of its buffer with alg, on its stream (the communicator's
// where streams is nil), and wait for it.
func allReduceAlone(comms []*comm.Communicator, bufs []cuda.DevicePtr, streams []*cuda.Stream, n int, alg coll.Algorithm) error {
	return ranks(comms, func(r int, c *comm.Communicator) error {
		var s *cuda.Stream
		if streams != nil {
			s = streams[r]
		}
		b := comm.DeviceBuffer(bufs[r])
		if err := c.AllReduce(b, b, n, coll.BF16, coll.Sum, comm.Options{Algorithm: alg, Stream: s}); err != nil {
			return err
		}
		return c.Synchronize(s)
	})
}
