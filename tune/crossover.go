package tune

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/spec"
)

// nccl is NCCL's name in bench results and decisions.
const nccl = string(coll.NCCL)

// auto is the automatic selection's name in bench results: what the
// rules compiled into the bench picked.
const auto = "auto"

// DefaultMargin is the noise margin Crossovers uses when Options.Margin is
// 0: an algorithm must be more than 15% faster than the incumbent to take
// over. A run-to-run jitter of ±5% on each latency can make one of two
// equal algorithms look 1.05/0.95 = 1.105 times faster than the other, and
// the fastest of several noisy latencies is biased low; the margin must
// clear both.
const DefaultMargin = 0.15

// lookahead is how many sizes (this one included) a challenger's latency
// is averaged over.
const lookahead = 3

// ErrNoSamples is returned by Crossovers when no sample passes the filters.
var ErrNoSamples = errors.New("no bench samples to tune from")

// Options control Crossovers.
type Options struct {
	// Margin is the noise margin, a fraction: an algorithm takes over from
	// the incumbent only where the incumbent is more than Margin slower
	// than the fastest; no pick is ever more than Margin slower than NCCL
	// where NCCL was measured. 0 means DefaultMargin.
	Margin float64
	// Backend keeps only samples of this bench backend; "" means "gpu".
	Backend string
	// DType and Op, when not empty, keep only samples of that element
	// type and reduce op (otherwise latencies of every dtype and op of a
	// size are pooled by their median).
	DType, Op string
	// Allowed maps a collective to the algorithms the topology generates;
	// others are ignored (NCCL is always allowed). A collective absent
	// from a non-nil map may only use NCCL.
	Allowed map[string][]string
	// Host tunes a topology without NCCL (host_shm): NCCL samples are
	// ignored and the last rule has no upper bound.
	Host bool
	// Jitter is the expected run-to-run jitter of one latency, a
	// fraction, used only to flag close calls (Decision.Close); 0 means
	// DefaultJitter.
	Jitter float64
}

// DefaultJitter is the run-to-run jitter Options.Jitter assumes: ±5%.
const DefaultJitter = 0.05

// jitter returns the effective jitter.
func (o Options) jitter() float64 {
	if o.Jitter == 0 {
		return DefaultJitter
	}
	return o.Jitter
}

// margin returns the effective margin.
func (o Options) margin() float64 {
	if o.Margin == 0 {
		return DefaultMargin
	}
	return o.Margin
}

// Decision is what Crossovers chose at one measured size.
type Decision struct {
	// Bytes is the message size.
	Bytes int64
	// Pick is the chosen algorithm (or "nccl"), PickUS its latency.
	Pick   string
	PickUS float64
	// Fastest is the fastest algorithm measured at this size, FastestUS
	// its latency.
	Fastest   string
	FastestUS float64
	// NCCLUS is NCCL's latency, 0 where NCCL was not measured.
	NCCLUS float64
	// How says why Pick was chosen: "fastest"; "kept" (the incumbent,
	// not the fastest but within the margin); "took over" (the incumbent
	// was more than the margin slower, or not measured here); "within
	// margin" (at the first size, not the fastest but preferred by the tie
	// order); or "merged" (a one-size flip smoothed over by hysteresis).
	How string
	// Close marks a close call: the incumbent's latency over the fastest
	// was within the jitter band (a factor (1+Jitter)^2) of the margin,
	// so another run may well move this crossover by one size. Pooling
	// several sweeps (more --from files) settles it.
	Close bool
}

// Table is the tuned rules of one collective at one world size.
type Table struct {
	// Collective and World say what was tuned.
	Collective string
	World      int
	// Decisions holds one entry per measured size, ascending.
	Decisions []Decision
	// Rules are the size rules: strictly increasing bounds, each the
	// last measured size of a run of equal picks, and a last, unbounded
	// rule: NCCL for sizes above the largest measured one (the loader's
	// own default), or for Host the last pick.
	Rules []spec.Rule
}

// curve holds one (collective, world)'s latencies: lat[alg][size].
type curve struct {
	collective string
	world      int
	lat        map[string]map[int64]float64
	sizes      []int64
}

// Crossovers turns bench samples into size rules per collective and world
// size. Latencies of the same point (several files, dtypes or ops) are
// pooled by their median. At each measured size, ascending, the incumbent
// (the previous size's pick) is kept while it is within the margin of the
// fastest; otherwise a challenger takes over: of the algorithms within the
// margin of the fastest, the one with the lowest mean latency relative to
// the fastest over this and the next two sizes; where several are within
// half the margin of that one, the first in the tie order (NCCL, then
// barrier, LL, LL128 and Lamport algorithms by name), so that near-ties are settled
// by the order and not by the noise. No pick is ever more than the margin
// slower than NCCL. Then hysteresis merges runs of a single size into a
// neighbour that is within twice the margin of the fastest there (and
// within the margin of NCCL). Tables come sorted by collective (canonical
// order) and world size. A sample of an unknown collective is an error.
func Crossovers(samples []Sample, o Options) ([]Table, error) {
	curves, err := pool(samples, o, false)
	if err != nil {
		return nil, err
	}
	tables := make([]Table, 0, len(curves))
	for i := range curves {
		tables = append(tables, curves[i].tune(o))
	}
	return tables, nil
}

// pool groups the samples that pass o's filters into one curve per
// collective and world size (canonical collective order, ascending world
// sizes), each point the median of its samples. Rows of the automatic
// selection ("auto") are kept only with keepAuto. A sample of an unknown
// collective is an error; no sample left is ErrNoSamples.
func pool(samples []Sample, o Options, keepAuto bool) ([]curve, error) {
	backend := o.Backend
	if backend == "" {
		backend = "gpu"
	}
	pooled := map[string]map[int]map[string]map[int64][]float64{}
	n := 0
	for _, s := range samples {
		if !slices.Contains(coll.Collectives(), coll.Collective(s.Collective)) {
			return nil, fmt.Errorf("%s: unknown collective %q (known: allreduce, reduce_scatter, allgather)", s.Pos, s.Collective)
		}
		if s.Backend != "" && s.Backend != backend || s.Algorithm == auto && !keepAuto ||
			o.DType != "" && s.DType != o.DType || o.Op != "" && s.Op != o.Op {
			continue
		}
		if s.Algorithm == nccl && o.Host {
			continue
		}
		if o.Allowed != nil && s.Algorithm != nccl && s.Algorithm != auto && !slices.Contains(o.Allowed[s.Collective], s.Algorithm) {
			continue
		}
		if pooled[s.Collective] == nil {
			pooled[s.Collective] = map[int]map[string]map[int64][]float64{}
		}
		byWorld := pooled[s.Collective]
		if byWorld[s.World] == nil {
			byWorld[s.World] = map[string]map[int64][]float64{}
		}
		if byWorld[s.World][s.Algorithm] == nil {
			byWorld[s.World][s.Algorithm] = map[int64][]float64{}
		}
		byWorld[s.World][s.Algorithm][s.Bytes] = append(byWorld[s.World][s.Algorithm][s.Bytes], s.MedianUS)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%w (backend %s%s)", ErrNoSamples, backend, filterNote(o))
	}
	var curves []curve
	for _, c := range coll.Collectives() {
		byWorld := pooled[string(c)]
		worlds := make([]int, 0, len(byWorld))
		for w := range byWorld {
			worlds = append(worlds, w)
		}
		sort.Ints(worlds)
		for _, w := range worlds {
			cv := curve{collective: string(c), world: w, lat: map[string]map[int64]float64{}}
			seen := map[int64]bool{}
			for alg, bySize := range byWorld[w] {
				cv.lat[alg] = map[int64]float64{}
				for size, xs := range bySize {
					cv.lat[alg][size] = median(xs)
					if !seen[size] {
						seen[size] = true
						cv.sizes = append(cv.sizes, size)
					}
				}
			}
			slices.Sort(cv.sizes)
			curves = append(curves, cv)
		}
	}
	return curves, nil
}

// filterNote describes the dtype/op filters for ErrNoSamples.
func filterNote(o Options) string {
	s := ""
	if o.DType != "" {
		s += ", dtype " + o.DType
	}
	if o.Op != "" {
		s += ", op " + o.Op
	}
	return s
}

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// algs returns the algorithms measured, barrier before LL before LL128
// before Lamport, NCCL last: the order ties fall back on.
func (cv *curve) algs() []string {
	var out []string
	for a := range cv.lat {
		if a != nccl {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, algOrder)
	if _, ok := cv.lat[nccl]; ok {
		out = append(out, nccl)
	}
	return out
}

// at returns alg's latency at size, and whether it was measured.
func (cv *curve) at(alg string, size int64) (float64, bool) {
	t, ok := cv.lat[alg][size]
	return t, ok
}

// fastest returns the fastest algorithm at size and its latency.
func (cv *curve) fastest(algs []string, size int64) (string, float64) {
	best, bt := "", math.Inf(1)
	for _, a := range algs {
		if t, ok := cv.at(a, size); ok && t < bt {
			best, bt = a, t
		}
	}
	return best, bt
}

// tune computes the decisions and rules of one curve.
func (cv *curve) tune(o Options) Table {
	m, noise := o.margin(), math.Pow(1+o.jitter(), 2)
	algs := cv.algs()
	// ratio is a's latency over the fastest at size; +Inf if a was not
	// measured there.
	ratio := func(a string, size int64) float64 {
		lat, ok := cv.at(a, size)
		if !ok {
			return math.Inf(1)
		}
		_, bt := cv.fastest(algs, size)
		return lat / bt
	}
	// within reports whether a is within the factor 1+f of the fastest at
	// size, and within the margin of NCCL where NCCL was measured.
	within := func(a string, size int64, f float64) bool {
		if ratio(a, size) > 1+f {
			return false
		}
		lat, _ := cv.at(a, size)
		nt, ok := cv.at(nccl, size)
		return !ok || lat <= nt*(1+m)
	}
	// order is the tie order: NCCL first (no kernel of ours), then
	// barrier, LL, LL128 and Lamport algorithms by name.
	order := []string{nccl}
	for _, a := range algs {
		if a != nccl {
			order = append(order, a)
		}
	}
	tab := Table{Collective: cv.collective, World: cv.world}
	cur := ""
	for i, size := range cv.sizes {
		d := Decision{Bytes: size}
		d.Fastest, d.FastestUS = cv.fastest(algs, size)
		d.NCCLUS, _ = cv.at(nccl, size)
		r := ratio(cur, size)
		switch {
		case cur != "" && within(cur, size, m):
			d.Pick, d.How = cur, "kept"
			d.Close = r > (1+m)/noise
		default:
			// The challenger: among the algorithms within the margin here,
			// the best by mean log latency relative to the fastest over
			// this and the next lookahead-1 sizes (averaging cuts the
			// noise); any within half the margin of that one counts as
			// equal, and then the tie order decides, not the noise.
			type cand struct {
				alg   string
				score float64
			}
			var cands []cand
			bestScore := math.Inf(1)
			for _, a := range order {
				if !within(a, size, m) {
					continue
				}
				sum, k := 0.0, 0
				for _, s := range cv.sizes[i:min(i+lookahead, len(cv.sizes))] {
					if q := ratio(a, s); !math.IsInf(q, 1) {
						sum += math.Log(q)
						k++
					}
				}
				cands = append(cands, cand{a, sum / float64(k)})
				bestScore = min(bestScore, sum/float64(k))
			}
			for _, c := range cands {
				if c.score <= bestScore+math.Log1p(m/2) {
					d.Pick = c.alg
					break
				}
			}
			d.How = "within margin"
			if cur != "" {
				d.How = "took over"
				d.Close = !math.IsInf(r, 1) && r < (1+m)*noise
			}
		}
		if d.Pick == d.Fastest && d.How != "took over" {
			d.How = "fastest"
		}
		d.PickUS, _ = cv.at(d.Pick, size)
		cur = d.Pick
		tab.Decisions = append(tab.Decisions, d)
	}
	// Hysteresis: a run of one size goes to a neighbour's algorithm where
	// that is within twice the margin of the fastest (and within the
	// margin of NCCL), the previous size's first.
	for changed := true; changed; {
		changed = false
		ds := tab.Decisions
		for i := range ds {
			prev, next := "", ""
			if i > 0 {
				prev = ds[i-1].Pick
			}
			if i+1 < len(ds) {
				next = ds[i+1].Pick
			}
			if ds[i].Pick == prev || ds[i].Pick == next || prev == "" && next == "" {
				continue
			}
			for _, c := range []string{prev, next} {
				if c == "" || !within(c, ds[i].Bytes, 2*m) {
					continue
				}
				ds[i].Pick, ds[i].How = c, "merged"
				ds[i].PickUS, _ = cv.at(c, ds[i].Bytes)
				changed = true
				break
			}
		}
	}
	tab.Rules = rules(tab.Decisions, o.Host)
	return tab
}

// rules turns runs of equal picks into size rules.
func rules(ds []Decision, host bool) []spec.Rule {
	var out []spec.Rule
	for i, d := range ds {
		if i+1 < len(ds) && ds[i+1].Pick == d.Pick {
			continue
		}
		out = append(out, spec.Rule{UpTo: d.Bytes, Use: coll.Algorithm(d.Pick)})
	}
	switch n := len(out); {
	case n > 0 && (host || out[n-1].Use == coll.NCCL):
		out[n-1].UpTo = 0
	case n > 0:
		out = append(out, spec.Rule{Use: coll.NCCL}) // what the loader would append
	}
	return out
}
