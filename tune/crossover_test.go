package tune_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/spec"
	"github.com/collgen/collgen/tune"
)

// readFiles reads bench CSVs.
func readFiles(t *testing.T, files ...string) []tune.Sample {
	t.Helper()
	var out []tune.Sample
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		s, err := tune.ReadCSV(fh, f)
		fh.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s...)
	}
	return out
}

// rulesOf renders every table's rules on one line each.
func rulesOf(ts []tune.Table) string {
	var b strings.Builder
	for _, t := range ts {
		fmt.Fprintf(&b, "%s w%d %v\n", t.Collective, t.World, t.Rules)
	}
	return b.String()
}

// checkRules asserts the invariants every table's rules keep: bounds
// strictly increasing, the last rule (only) unbounded, every pick within the
// margin of NCCL where NCCL was measured, and the rules reproduce the
// decisions.
func checkRules(t *testing.T, tables []tune.Table, margin float64) {
	t.Helper()
	for _, tb := range tables {
		if n := len(tb.Rules); n == 0 || tb.Rules[n-1].UpTo != 0 {
			t.Errorf("%s w%d: last rule bounded: %v", tb.Collective, tb.World, tb.Rules)
		}
		for i, r := range tb.Rules {
			if r.UpTo == 0 && i != len(tb.Rules)-1 {
				t.Errorf("%s w%d: unbounded rule %d of %d", tb.Collective, tb.World, i, len(tb.Rules))
			}
			if i > 0 && r.UpTo != 0 && r.UpTo <= tb.Rules[i-1].UpTo {
				t.Errorf("%s w%d: bounds not increasing: %v", tb.Collective, tb.World, tb.Rules)
			}
		}
		topo := spec.Topology{Select: map[coll.Collective][]spec.Rule{coll.Collective(tb.Collective): tb.Rules}}
		for _, d := range tb.Decisions {
			if d.NCCLUS > 0 && d.PickUS > d.NCCLUS*(1+margin)+1e-9 {
				t.Errorf("%s w%d %d: %s at %.2fus is more than %.0f%% slower than NCCL's %.2fus",
					tb.Collective, tb.World, d.Bytes, d.Pick, d.PickUS, 100*margin, d.NCCLUS)
			}
			if got := topo.Choose(coll.Collective(tb.Collective), d.Bytes); string(got) != d.Pick {
				t.Errorf("%s w%d %d: rules choose %s, decision was %s", tb.Collective, tb.World, d.Bytes, got, d.Pick)
			}
		}
	}
}

// TestRecordedSweep tunes the recorded 4 x H200 sweeps (docs/results) and
// compares rules and decisions with the golden file.
func TestRecordedSweep(t *testing.T) {
	samples := readFiles(t, "testdata/h200x4-w2.csv", "testdata/h200x4-w4.csv")
	tables, err := tune.Crossovers(samples, tune.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkRules(t, tables, tune.DefaultMargin)
	var b bytes.Buffer
	b.WriteString(rulesOf(tables))
	b.WriteString("\n")
	b.WriteString(tune.SelectYAML("", tables))
	b.WriteString("\n")
	if err := tune.WriteDecisions(&b, tables); err != nil {
		t.Fatal(err)
	}
	b.WriteString("\nclose calls:\n" + strings.Join(tune.CloseCalls(tables), "\n") + "\n")
	golden(t, "crossovers/h200x4.golden", b.Bytes())
	if len(tables) != 6 {
		t.Errorf("%d tables, want 3 collectives x 2 world sizes", len(tables))
	}
}

// TestJitter: two runs of the same (synthetic) machine, each latency
// jittered by up to ±5%, give identical rules, equal to the noiseless
// machine's. Without the margin (1e-9) the same runs disagree, so the
// test can fail.
func TestJitter(t *testing.T) {
	exact, err := tune.Crossovers(readSynth(0, 0), tune.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := "allreduce w4 [{262144 oneshot_ll} {33554432 twoshot_ll128} {0 nccl}]\n" +
		"allreduce w8 [{262144 oneshot_ll} {33554432 twoshot_ll128} {0 nccl}]\n" +
		"allgather w4 [{262144 oneshot_ll} {33554432 oneshot_ll128} {0 nccl}]\n"
	if got := rulesOf(exact); got != want {
		t.Fatalf("noiseless rules\n%s\nwant\n%s", got, want)
	}
	checkRules(t, exact, tune.DefaultMargin)
	// Two runs kept as CSV fixtures (go test -update rewrites them).
	golden(t, "synth/run1.csv", []byte(synthCSV(synthMachine, 0.05, 1001)))
	golden(t, "synth/run2.csv", []byte(synthCSV(synthMachine, 0.05, 1002)))
	for _, f := range []string{"testdata/synth/run1.csv", "testdata/synth/run2.csv"} {
		ts, err := tune.Crossovers(readFiles(t, f), tune.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if rulesOf(ts) != want {
			t.Errorf("%s: rules\n%s\nwant\n%s", f, rulesOf(ts), want)
		}
	}
	differ := 0
	for seed := int64(1); seed <= 40; seed += 2 {
		a, _ := tune.Crossovers(readSynth(0.05, seed), tune.Options{})
		b, _ := tune.Crossovers(readSynth(0.05, seed+1), tune.Options{})
		checkRules(t, a, tune.DefaultMargin)
		if rulesOf(a) != want || rulesOf(b) != want {
			t.Errorf("seeds %d, %d: rules\n%s\n%s\nwant\n%s", seed, seed+1, rulesOf(a), rulesOf(b), want)
		}
		a, _ = tune.Crossovers(readSynth(0.05, seed), tune.Options{Margin: 1e-9})
		b, _ = tune.Crossovers(readSynth(0.05, seed+1), tune.Options{Margin: 1e-9})
		if rulesOf(a) != rulesOf(b) {
			differ++
		}
	}
	t.Logf("without a margin %d of 20 jittered pairs differ", differ)
	if differ < 15 {
		t.Errorf("without a margin only %d of 20 jittered pairs differ; the fixture does not exercise the margin", differ)
	}
}

// csvOf builds a bench CSV from "alg bytes us" lines (allreduce, world 4).
func csvOf(rows ...string) []tune.Sample {
	var b strings.Builder
	b.WriteString("backend,collective,algorithm,dtype,op,world,bytes,iters,median_us,bus_gbps,baseline,ratio\n")
	for _, r := range rows {
		var alg string
		var bytes int64
		var us float64
		fmt.Sscan(r, &alg, &bytes, &us)
		fmt.Fprintf(&b, "gpu,allreduce,%s,bf16,sum,4,%d,100,%g,0,,0\n", alg, bytes, us)
	}
	s, err := tune.ReadCSV(strings.NewReader(b.String()), "rows.csv")
	if err != nil {
		panic(err)
	}
	return s
}

// ladder gives alg latencies at 1KiB..128KiB (8 sizes) from a list.
func ladder(alg string, us ...float64) []string {
	var rows []string
	for i, u := range us {
		rows = append(rows, fmt.Sprintf("%s %d %g", alg, int64(1024)<<i, u))
	}
	return rows
}

func TestHysteresisAndMargin(t *testing.T) {
	nccl := ladder("nccl", 20, 20, 20, 20, 20, 20, 20, 20)
	cases := []struct {
		name string
		rows [][]string
		want string
	}{
		{"a one-size dip within twice the margin is merged",
			[][]string{nccl, ladder("oneshot", 5, 5, 5, 5, 5, 5, 5, 5), ladder("twoshot", 9, 9, 9, 4, 9, 9, 9, 9)},
			"[{131072 oneshot} {0 nccl}]"},
		{"a one-size dip beyond twice the margin stays",
			[][]string{nccl, ladder("oneshot", 5, 5, 5, 5, 5, 5, 5, 5), ladder("twoshot", 9, 9, 9, 3, 9, 9, 9, 9)},
			"[{4096 oneshot} {8192 twoshot} {131072 oneshot} {0 nccl}]"},
		{"less than the margin faster does not take over",
			[][]string{nccl, ladder("oneshot", 5, 5, 5, 5, 5, 5, 5, 5), ladder("twoshot", 9, 9, 9, 4.5, 4.5, 4.5, 4.5, 4.5)},
			"[{131072 oneshot} {0 nccl}]"},
		{"more than the margin faster takes over",
			[][]string{nccl, ladder("oneshot", 5, 5, 5, 5, 5, 5, 5, 5), ladder("twoshot", 9, 9, 9, 4, 4, 4, 4, 4)},
			"[{4096 oneshot} {131072 twoshot} {0 nccl}]"},
		{"near-ties go to NCCL by the tie order",
			[][]string{ladder("nccl", 10, 10, 10, 10, 10, 10, 10, 10), ladder("oneshot", 9.5, 10.2, 9.6, 10.4, 9.7, 9.9, 10.1, 9.5)},
			"[{0 nccl}]"},
		{"near-ties go to LL128 before Lamport by the tie order",
			[][]string{nccl, ladder("oneshot_lamport", 5, 5.1, 4.9, 5, 5.1, 4.9, 5, 5), ladder("oneshot_ll128", 5.05, 5, 5, 5.1, 5, 5, 4.95, 5.05)},
			"[{131072 oneshot_ll128} {0 nccl}]"},
		{"never more than the margin slower than NCCL",
			[][]string{ladder("nccl", 10, 10, 10, 10, 10, 10, 10, 10), ladder("oneshot", 5, 5, 5, 5, 12, 13, 14, 15)},
			"[{8192 oneshot} {0 nccl}]"},
	}
	for _, tc := range cases {
		var rows []string
		for _, r := range tc.rows {
			rows = append(rows, r...)
		}
		tables, err := tune.Crossovers(csvOf(rows...), tune.Options{})
		if err != nil {
			t.Fatal(err)
		}
		checkRules(t, tables, tune.DefaultMargin)
		if got := fmt.Sprint(tables[0].Rules); got != tc.want {
			var b bytes.Buffer
			tune.WriteDecisions(&b, tables)
			t.Errorf("%s: rules %s, want %s\n%s", tc.name, got, tc.want, b.String())
		}
	}
}

func TestOptions(t *testing.T) {
	samples := readFiles(t, "testdata/h200x4-w4.csv")
	// Allowed: only oneshot may be used (and NCCL).
	tables, err := tune.Crossovers(samples, tune.Options{Allowed: map[string][]string{"allreduce": {"oneshot"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 3 || tables[1].Collective != "reduce_scatter" {
		t.Fatalf("tables %s", rulesOf(tables))
	}
	for _, tb := range tables {
		for _, r := range tb.Rules {
			if r.Use != "nccl" && (tb.Collective != "allreduce" || r.Use != "oneshot") {
				t.Errorf("%s uses %s", tb.Collective, r.Use)
			}
		}
	}
	// Host: NCCL rows are ignored and the last rule is unbounded.
	tables, err = tune.Crossovers(samples, tune.Options{Host: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		last := tb.Rules[len(tb.Rules)-1]
		if last.UpTo != 0 || last.Use == "nccl" {
			t.Errorf("host %s: %v", tb.Collective, tb.Rules)
		}
	}
	// Filters that leave nothing.
	_, err = tune.Crossovers(samples, tune.Options{DType: "f64"})
	if !errors.Is(err, tune.ErrNoSamples) || !strings.Contains(err.Error(), "dtype f64") {
		t.Errorf("f64: %v", err)
	}
	_, err = tune.Crossovers(samples, tune.Options{Backend: "host"})
	if !errors.Is(err, tune.ErrNoSamples) {
		t.Errorf("host backend: %v", err)
	}
	// Pooling two runs takes the median of each point.
	a := csvOf("oneshot 1024 4", "nccl 1024 8")
	b := csvOf("oneshot 1024 6", "nccl 1024 8")
	tables, _ = tune.Crossovers(append(a, b...), tune.Options{})
	if d := tables[0].Decisions[0]; d.PickUS != 5 || d.Pick != "oneshot" {
		t.Errorf("pooled %+v", d)
	}
}

func TestReadCSV(t *testing.T) {
	// Columns by name, in any order, extra ones ignored.
	s, err := tune.ReadCSV(strings.NewReader("median_us,extra,bytes,world,algorithm,collective\n4.5,x,1024,4,oneshot,allreduce\n"), "a.csv")
	if err != nil || len(s) != 1 || s[0].MedianUS != 4.5 || s[0].Bytes != 1024 || s[0].Pos != "a.csv:2" {
		t.Fatalf("%+v %v", s, err)
	}
	// Awkward twins (collgen bench --awkward) are not sizes the rules
	// choose by: skipped, from a CSV as from JSON results.
	s, err = tune.ReadCSV(strings.NewReader("collective,algorithm,world,bytes,median_us,awkward\nallreduce,oneshot,4,1024,4.5,\nallreduce,oneshot,4,1024,9,1\n"), "a.csv")
	if err != nil || len(s) != 1 || s[0].MedianUS != 4.5 {
		t.Errorf("a CSV with an awkward twin: %+v %v", s, err)
	}
	s, err = tune.FromResults([]bench.Result{
		{Collective: "allreduce", Algorithm: "oneshot", World: 4, Bytes: 1024, MedianUS: 4.5},
		{Collective: "allreduce", Algorithm: "oneshot", World: 4, Bytes: 1024, MedianUS: 9, Awkward: true},
	}, "a.json")
	if err != nil || len(s) != 1 || s[0].MedianUS != 4.5 {
		t.Errorf("results with an awkward twin: %+v %v", s, err)
	}
	bad := map[string]string{
		"":                                   "a.csv:1: empty file",
		"collective,algorithm,world,bytes\n": `a.csv:1: no "median_us" column`,
		"collective,algorithm,world,bytes,median_us\nallreduce,oneshot,0,1024,4\n":   `a.csv:2: world "0" is not a positive integer`,
		"collective,algorithm,world,bytes,median_us\nallreduce,oneshot,4,1k,4\n":     `a.csv:2: bytes "1k" is not a positive integer`,
		"collective,algorithm,world,bytes,median_us\nallreduce,oneshot,4,1024,-1\n":  `a.csv:2: median_us "-1" is not a positive number`,
		"collective,algorithm,world,bytes,median_us\nallreduce,oneshot,4,1024,NaN\n": `a.csv:2: median_us "NaN" is not a positive number`,
		"collective,algorithm,world,bytes,median_us\n,oneshot,4,1024,1\n":            `a.csv:2: empty collective`,
	}
	for in, want := range bad {
		_, err := tune.ReadCSV(strings.NewReader(in), "a.csv")
		var ce *tune.CSVError
		if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%q: %v, want %s", in, err, want)
		}
	}
	_, err = tune.Crossovers(csvOf("oneshot 1024 1")[:0], tune.Options{})
	if !errors.Is(err, tune.ErrNoSamples) {
		t.Errorf("no samples: %v", err)
	}
	s, _ = tune.ReadCSV(strings.NewReader("collective,algorithm,world,bytes,median_us\nbroadcast,x,4,1024,1\n"), "b.csv")
	if _, err := tune.Crossovers(s, tune.Options{}); err == nil || !strings.Contains(err.Error(), `b.csv:2: unknown collective "broadcast"`) {
		t.Errorf("unknown collective: %v", err)
	}
}

// TestJSONResults: results read back from collgen bench --json tune the
// same as the CSV.
func TestJSONResults(t *testing.T) {
	samples := readFiles(t, "testdata/h200x4-w4.csv")
	var rs []bench.Result
	for _, s := range samples {
		rs = append(rs, bench.Result{Backend: s.Backend, Collective: s.Collective, Algorithm: s.Algorithm, DType: s.DType,
			Op: s.Op, World: s.World, Bytes: s.Bytes, MedianUS: s.MedianUS})
	}
	var b bytes.Buffer
	if err := bench.WriteJSON(&b, rs); err != nil {
		t.Fatal(err)
	}
	back, err := bench.ReadJSON(&b)
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, err := tune.FromResults(back, "w4.json")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := tune.Crossovers(samples, tune.Options{})
	c, _ := tune.Crossovers(fromJSON, tune.Options{})
	if rulesOf(a) != rulesOf(c) {
		t.Errorf("csv\n%s\njson\n%s", rulesOf(a), rulesOf(c))
	}
	if _, err := tune.FromResults([]bench.Result{{Collective: "allreduce", Algorithm: "x", World: 4, Bytes: 1}}, "z.json"); err == nil ||
		!strings.Contains(err.Error(), "z.json: result 0") {
		t.Errorf("zero latency: %v", err)
	}
}
