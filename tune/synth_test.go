package tune_test

import (
	"fmt"
	"math/rand"
	"strings"

	"github.com/collgen/collgen/tune"
)

// model is one algorithm's latency, alpha + bytes/beta microseconds,
// measured up to maxBytes (0: every size).
type model struct {
	alg      string
	alpha    float64 // us
	beta     float64 // bytes per us
	maxBytes int64
}

// synthCSV writes the bench CSV of a synthetic machine: for each
// collective and world, every model at powers of two from 1KiB to 256MiB.
// jitter, when above 0, multiplies every latency by a factor drawn
// uniformly from [1-jitter, 1+jitter] with the given seed.
func synthCSV(models map[string]map[int][]model, jitter float64, seed int64) string {
	r := rand.New(rand.NewSource(seed))
	var b strings.Builder
	b.WriteString("backend,collective,algorithm,dtype,op,world,bytes,iters,median_us,bus_gbps,baseline,ratio\n")
	for _, c := range []string{"allreduce", "reduce_scatter", "allgather"} {
		for _, w := range []int{2, 4, 8} {
			for _, m := range models[c][w] {
				for s := int64(1024); s <= 256<<20; s *= 2 {
					if m.maxBytes > 0 && s > m.maxBytes {
						continue
					}
					t := m.alpha + float64(s)/m.beta
					if jitter > 0 {
						t *= 1 + (2*r.Float64()-1)*jitter
					}
					fmt.Fprintf(&b, "gpu,%s,%s,bf16,sum,%d,%d,1000,%.4f,0,nccl,0\n", c, m.alg, w, s, t)
				}
			}
		}
	}
	return b.String()
}

// synthMachine is a made-up NVSwitch box, world sizes 4 and 8: an LL
// kernel for small messages, an LL128 kernel (measured up to 32MiB, as the
// staging buffer allows) for medium ones, and for large ones a barrier
// kernel and NCCL with the same latency. Its crossovers are sharp: at every
// measured size, a challenger is either no faster than the incumbent or
// more than 1.12 x 1.105 faster, so a ±5% jitter (which can fake up to
// 1.05/0.95 = 1.105 between two algorithms) cannot move them; its
// near-ties (the barrier kernel and NCCL, equal) are what the margin and
// the tie order must resolve.
var synthMachine = map[string]map[int][]model{
	"allreduce": {
		4: {
			{"oneshot_ll", 4, 40e3, 32 << 20},
			{"twoshot_ll128", 9.5, 200e3, 32 << 20},
			{"twoshot", 14, 200e3, 0},
			{"nccl", 14, 200e3, 0},
		},
		8: {
			{"oneshot_ll", 5, 30e3, 32 << 20},
			{"twoshot_ll128", 13, 170e3, 32 << 20},
			{"twoshot", 16, 170e3, 0},
			{"nccl", 16, 170e3, 0},
		},
	},
	"allgather": {
		4: {
			{"oneshot_ll", 3.5, 50e3, 32 << 20},
			{"oneshot_ll128", 8.5, 240e3, 32 << 20},
			{"oneshot", 12, 200e3, 0},
			{"nccl", 12, 200e3, 0},
		},
	},
}

// readSynth parses synthCSV's output.
func readSynth(jitter float64, seed int64) []tune.Sample {
	s, err := tune.ReadCSV(strings.NewReader(synthCSV(synthMachine, jitter, seed)), "synth.csv")
	if err != nil {
		panic(err)
	}
	return s
}
