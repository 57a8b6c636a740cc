package tune_test

import (
	"bytes"
	"math"
	"testing"

	"github.com/collgen/collgen/spec"
	"github.com/collgen/collgen/tune"
)

// Compare looks up each rule set's pick among the forced-algorithm rows of
// the same sweep, and Summarize scores it against the fastest.
func TestCompareSynthetic(t *testing.T) {
	row := func(alg string, world int, bytes int64, us float64) tune.Sample {
		return tune.Sample{Backend: "gpu", Collective: "allreduce", Algorithm: alg, DType: "bf16", Op: "sum", World: world, Bytes: bytes, MedianUS: us}
	}
	samples := []tune.Sample{
		row("oneshot", 2, 1024, 10), row("twoshot", 2, 1024, 20), row("nccl", 2, 1024, 30), row("auto", 2, 1024, 21),
		row("oneshot", 2, 4096, 40), row("twoshot", 2, 4096, 20), row("nccl", 2, 4096, 30), row("auto", 2, 4096, 41),
		row("oneshot", 4, 1024, 10),
	}
	always := func(alg string) tune.RuleSet {
		return tune.RuleSet{Name: alg, Choose: func(_ string, w int, _ int64) (string, bool) { return alg, w == 2 }}
	}
	cs, err := tune.Compare(samples, tune.Options{}, []tune.RuleSet{always("oneshot"), always("twoshot"), always("hcm")})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].World != 2 || cs[1].World != 4 || len(cs[0].Sizes) != 2 {
		t.Fatalf("%+v", cs)
	}
	s := cs[0].Sizes[1]
	if s.Fastest != "twoshot" || s.FastestUS != 20 || s.AutoUS != 41 || s.Picks[0] != (tune.Pick{Algorithm: "oneshot", US: 40}) || s.Picks[2] != (tune.Pick{Algorithm: "hcm"}) {
		t.Errorf("4 KiB: %+v", s)
	}
	if p := cs[1].Sizes[0].Picks[0]; p != (tune.Pick{}) {
		t.Errorf("world 4, which the rule set has no rules for: %+v", p)
	}
	one, two, hcm := cs[0].Summarize(0, 0.15), cs[0].Summarize(1, 0.15), cs[0].Summarize(2, 0.15)
	if one.Sizes != 2 || math.Abs(one.Geomean-math.Sqrt2) > 1e-12 || one.Slow != 1 {
		t.Errorf("oneshot: %+v, want geomean sqrt(1*2) over 2 sizes, 1 slow", one)
	}
	if two.Sizes != 2 || math.Abs(two.Geomean-math.Sqrt2) > 1e-12 || two.Slow != 1 {
		t.Errorf("twoshot: %+v", two)
	}
	if hcm.Sizes != 0 || hcm.Missing != 2 {
		t.Errorf("hcm, never measured: %+v", hcm)
	}
}

// The recorded 4 x H200 sweep at world 2, with the rules shipped before
// the world-2 rules and the tuned world-2 rules as `collgen tune` wrote
// them (testdata/tuned-2026-11-22.yaml; the shipped spec has since ended
// staged sizes at 16 MiB to bound the staging buffer): on this sweep, independent of
// the 2 x H200 one they were tuned on, the world-2 rules are never more
// than the margin slower than the fastest (the old ones were, at 2, 2 and
// 1 sizes), and all-reduce costs less overall (geomean 1.010x the fastest
// against 1.037x; reduce-scatter and all-gather stay within 0.01x).
func TestCompareRecorded(t *testing.T) {
	samples := readFiles(t, "testdata/h200x4-w2.csv")
	var sets []tune.RuleSet
	for _, f := range []struct{ name, file string }{{"shipped", "testdata/shipped-2026-11-22.yaml"}, {"tuned", "testdata/tuned-2026-11-22.yaml"}} {
		s, err := spec.Load(f.file)
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, tune.TopologyRules(f.name, s.Topology("nvswitch")))
	}
	cs, err := tune.Compare(samples, tune.Options{DType: "bf16"}, sets)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := tune.WriteComparisons(&b, []string{"shipped", "tuned"}, cs, tune.DefaultMargin); err != nil {
		t.Fatal(err)
	}
	golden(t, "compare/h200x4-w2.golden", b.Bytes())
	for _, c := range cs {
		old, tuned := c.Summarize(0, tune.DefaultMargin), c.Summarize(1, tune.DefaultMargin)
		if tuned.Slow != 0 || old.Slow == 0 || tuned.Sizes != 19 {
			t.Errorf("%s: tuned %+v, shipped %+v; want no tuned pick more than the margin slower", c.Collective, tuned, old)
		}
		if c.Collective == "allreduce" && tuned.Geomean >= old.Geomean {
			t.Errorf("allreduce: tuned geomean %.3f, shipped %.3f", tuned.Geomean, old.Geomean)
		}
	}
}
