package proof

import (
	"errors"
	"fmt"
	"os"
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
// every GPU's world) with early launch, as shipped. World 8 on one shared
// GPU is left out: its first back-to-back calls still time out now and
// then, for a reason not found (docs/reliability.md, "Cases still open").
// envBackToBackW8, set to anything, puts world 8 back into
// TestBackToBackGPU on a shared GPU (the open case's investigation);
// envBackToBackStagger (a duration) starts rank r's calls r times that
// late, to tell a race of the ranks' first launches from the rest.
const (
	envBackToBackW8      = "COLLGEN_TEST_BACK_TO_BACK_W8"
	envBackToBackStagger = "COLLGEN_TEST_BACK_TO_BACK_STAGGER"
)

func TestBackToBackGPU(t *testing.T) {
	ngpu := proofGPUs(t)
	var stagger time.Duration
	if v := os.Getenv(envBackToBackStagger); v != "" {
		var err error
		if stagger, err = time.ParseDuration(v); err != nil {
			t.Fatalf("%s=%q: %v", envBackToBackStagger, v, err)
		}
	}
	for _, w := range []int{2, 3, 4, 8} {
		if w > ngpu || (!sharedGPU() && w != ngpu) || (sharedGPU() && w == 8 && os.Getenv(envBackToBackW8) == "") {
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
			for _, alg := range []coll.Algorithm{coll.OneShotLL, coll.OneShotLL128, coll.TwoShotLL128} {
				for _, count := range []int{32 << 10, n} {
					start := time.Now()
					// Where a rank is 8 s into the 10 s deadline: every
					// goroutine's stack, so a stalled host call shows.
					stacks := stacksAfter(t, 8*time.Second, fmt.Sprintf("%s, %d bf16: still running after 8s", alg, count))
					err := ranks(comms, func(r int, c *comm.Communicator) error {
						time.Sleep(time.Duration(r) * stagger)
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
					if err != nil {
						t.Fatalf("%s, %d bf16, 64 back to back: %v", alg, count, err)
					}
					t.Logf("%s, %d bf16: 64 back to back in %v", alg, count, time.Since(start))
				}
			}
		})
	}
}
