package tune

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/spec"
)

// RuleSet is a set of size rules to evaluate on measured sweeps, such as
// one spec topology's select.
type RuleSet struct {
	// Name labels the rule set's column.
	Name string
	// Choose returns the algorithm (or "nccl") the rules pick for a
	// message of bytes of collective at world size world, and false where
	// the rule set has no rules for that world size.
	Choose func(collective string, world int, bytes int64) (string, bool)
}

// TopologyRules is the RuleSet of a spec topology's select
// (spec.Topology.ChooseFor), for the world sizes the topology lists.
func TopologyRules(name string, t *spec.Topology) RuleSet {
	return RuleSet{Name: name, Choose: func(c string, w int, n int64) (string, bool) {
		if !slices.Contains(t.WorldSizes, w) {
			return "", false
		}
		return string(t.ChooseFor(coll.Collective(c), w, n)), true
	}}
}

// Pick is what one rule set picks at one size, and what it costs there.
type Pick struct {
	// Algorithm is the pick ("" where the rule set has no rules for the
	// world size).
	Algorithm string
	// US is the pick's measured latency, 0 where it was not measured.
	US float64
}

// ComparedSize is one measured size of a Comparison.
type ComparedSize struct {
	Bytes int64 // message size in bytes
	// Fastest is the fastest algorithm measured (NCCL included), FastestUS
	// its latency.
	Fastest   string
	FastestUS float64
	// AutoUS is the latency of the automatic selection the bench ran
	// (rows "auto": the rules compiled into the bench), 0 if not measured.
	AutoUS float64
	// Picks holds one Pick per rule set, in the order given.
	Picks []Pick
}

// Comparison is the rule sets evaluated on one collective at one world size.
type Comparison struct {
	Collective string         // as the sweep names it: allreduce, reduce_scatter, allgather
	World      int            // ranks
	Sizes      []ComparedSize // one per measured size, ascending
}

// Compare evaluates rule sets on sweeps: at every measured size of every
// collective and world size, what each rule set picks and the latency the
// sweep measured for that pick (forced-algorithm rows of the same run, so
// the rule sets are compared on equal terms), next to the fastest measured
// and the bench's own automatic selection. Samples are filtered and pooled
// as in Crossovers (o.Allowed, o.Margin and o.Host are not used).
func Compare(samples []Sample, o Options, sets []RuleSet) ([]Comparison, error) {
	o.Allowed, o.Host = nil, false
	curves, err := pool(samples, o, true)
	if err != nil {
		return nil, err
	}
	var out []Comparison
	for i := range curves {
		cv := &curves[i]
		var algs []string
		for _, a := range cv.algs() {
			if a != auto {
				algs = append(algs, a)
			}
		}
		cmp := Comparison{Collective: cv.collective, World: cv.world}
		for _, size := range cv.sizes {
			cs := ComparedSize{Bytes: size}
			cs.Fastest, cs.FastestUS = cv.fastest(algs, size)
			cs.AutoUS, _ = cv.at(auto, size)
			for _, rs := range sets {
				var p Pick
				if alg, ok := rs.Choose(cv.collective, cv.world, size); ok {
					p.Algorithm = alg
					p.US, _ = cv.at(alg, size)
				}
				cs.Picks = append(cs.Picks, p)
			}
			cmp.Sizes = append(cmp.Sizes, cs)
		}
		out = append(out, cmp)
	}
	return out, nil
}

// Summary is one rule set's cost over a Comparison's sizes.
type Summary struct {
	// Geomean is the geometric mean of the pick's latency over the
	// fastest, over the sizes where both were measured (1: always the
	// fastest); Sizes counts those sizes.
	Geomean float64
	Sizes   int
	// Slow counts the sizes where the pick was more than margin slower
	// than the fastest; Missing the sizes where the pick was not measured.
	Slow, Missing int
}

// Summarize returns rule set i's Summary over c.
func (c *Comparison) Summarize(i int, margin float64) Summary {
	var s Summary
	logSum := 0.0
	for _, cs := range c.Sizes {
		p := cs.Picks[i]
		switch {
		case p.Algorithm == "":
			continue
		case p.US == 0 || cs.FastestUS == 0:
			s.Missing++
			continue
		}
		r := p.US / cs.FastestUS
		logSum += math.Log(r)
		s.Sizes++
		if r > 1+margin {
			s.Slow++
		}
	}
	if s.Sizes > 0 {
		s.Geomean = math.Exp(logSum / float64(s.Sizes))
	}
	return s
}

// WriteComparisons prints each comparison as a table, one column per rule
// set (its pick, latency and ratio to the fastest), the bench's own
// automatic selection, and a summary line per rule set.
func WriteComparisons(w io.Writer, names []string, cs []Comparison, margin float64) error {
	for k, c := range cs {
		if k > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s at world size %d (median us; x: over the fastest measured; auto: what the bench's own rules ran)\n", c.Collective, c.World)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "size\tfastest\tauto\t%s\n", strings.Join(names, "\t"))
		for _, s := range c.Sizes {
			fmt.Fprintf(tw, "%s\t%s %.1f\t%s", spec.FormatSize(s.Bytes), s.Fastest, s.FastestUS, latency(s.AutoUS, s.FastestUS))
			for _, p := range s.Picks {
				switch {
				case p.Algorithm == "":
					fmt.Fprint(tw, "\t-")
				default:
					fmt.Fprintf(tw, "\t%s %s", p.Algorithm, latency(p.US, s.FastestUS))
				}
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for i, n := range names {
			s := c.Summarize(i, margin)
			if s.Sizes == 0 && s.Missing == 0 {
				fmt.Fprintf(w, "  %s: no rules at world size %d\n", n, c.World)
				continue
			}
			fmt.Fprintf(w, "  %s: geomean %.3fx the fastest over %d sizes, %d more than %.0f%% slower", n, s.Geomean, s.Sizes, s.Slow, 100*margin)
			if s.Missing > 0 {
				fmt.Fprintf(w, ", %d picks not measured", s.Missing)
			}
			fmt.Fprintln(w)
		}
	}
	return nil
}

// latency formats a measured latency and its ratio to the fastest, or "-".
func latency(us, fastest float64) string {
	if us == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f (%.2fx)", us, us/fastest)
}
