package tune_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/spec"
	"github.com/collgen/collgen/tune"
)

// checkOnlyTuned fails t unless after's select rules are before's, but
// for topology tuned's collectives in rules, which are rules.
func checkOnlyTuned(t *testing.T, before, after *spec.Spec, tuned string, rules map[coll.Collective][]spec.Rule, out []byte) {
	t.Helper()
	for i, bt := range before.Topologies {
		at := after.Topologies[i]
		for _, c := range coll.Collectives() {
			want := bt.Select[c]
			if r, ok := rules[c]; ok && bt.Name == tuned {
				want = r
			}
			if fmt.Sprint(at.Select[c]) != fmt.Sprint(want) {
				t.Errorf("topology %s %s: %v, want %v\n%s", bt.Name, c, at.Select[c], want, out)
			}
		}
	}
}

func TestReplaceSelect(t *testing.T) {
	data, err := os.ReadFile("testdata/base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	before, err := spec.Parse("base.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	rules := map[coll.Collective][]spec.Rule{
		coll.AllReduce: {{UpTo: 128 << 10, Use: "oneshot_ll"}, {UpTo: 32 << 20, Use: "twoshot_ll128"}, {Use: "nccl"}},
	}
	out, err := tune.ReplaceSelect("base.yaml", data, "nvswitch", rules, "tuned")
	if err != nil {
		t.Fatal(err)
	}
	after, err := spec.Parse("tuned.yaml", out)
	if err != nil {
		t.Fatal(err)
	}
	checkOnlyTuned(t, before, after, "nvswitch", rules, out)
	for i, bt := range before.Topologies {
		at := after.Topologies[i]
		if fmt.Sprint(at.Generate) != fmt.Sprint(bt.Generate) || fmt.Sprint(at.WorldSizes) != fmt.Sprint(bt.WorldSizes) {
			t.Errorf("%s changed", bt.Name)
		}
	}
	if fmt.Sprint(after.Algorithms) != fmt.Sprint(before.Algorithms) {
		t.Errorf("algorithms changed")
	}
	for _, want := range []string{"select: # tuned\n", "# crossovers measured on 4 x H200", "    - {upto: 128KiB, use: oneshot_ll}\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// A topology without select gets one; a missing topology is an error;
	// rules the loader refuses are an error and nothing comes back.
	small := []byte("version: 1\npackage: p\ntopologies:\n  t:\n    kind: nvlink_full\n    world_sizes: [2]\n    generate:\n      allreduce: [oneshot]\n")
	out, err = tune.ReplaceSelect("s.yaml", small, "t", map[coll.Collective][]spec.Rule{coll.AllReduce: {{UpTo: 1024, Use: "oneshot"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse("s.yaml", out)
	if err != nil || s.Topologies[0].Choose(coll.AllReduce, 1024) != "oneshot" || s.Topologies[0].Choose(coll.AllReduce, 1025) != "nccl" {
		t.Errorf("%v\n%s", err, out)
	}
	if _, err := tune.ReplaceSelect("s.yaml", small, "u", nil, ""); err == nil || !strings.Contains(err.Error(), `no topology "u"`) {
		t.Errorf("missing topology: %v", err)
	}
	_, err = tune.ReplaceSelect("s.yaml", small, "t", map[coll.Collective][]spec.Rule{coll.AllReduce: {{UpTo: 1024, Use: "twoshot"}}}, "")
	if err == nil || !strings.Contains(err.Error(), "does not load") || !strings.Contains(err.Error(), "twoshot") {
		t.Errorf("refused rules: %v", err)
	}
}

func TestReplaceSelectPerWorld(t *testing.T) {
	data := []byte(`version: 1
package: p
topologies:
  t:
    kind: nvlink_full
    world_sizes: [2-4, 8]
    generate:
      allreduce: [oneshot, twoshot]
      reduce_scatter: [oneshot]
    select:
      allreduce:
        - {upto: 1MiB, use: oneshot}
      reduce_scatter:
        - {upto: 1MiB, use: oneshot}
`)
	base, err := spec.Parse("s.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	w2 := []spec.Rule{{UpTo: 64 << 10, Use: "oneshot"}, {UpTo: 32 << 20, Use: "twoshot"}, {Use: "nccl"}}
	w3 := []spec.Rule{{UpTo: 256 << 10, Use: "oneshot"}, {Use: "nccl"}}
	tables := []tune.Table{
		{Collective: "allreduce", World: 2, Rules: w2},
		{Collective: "allreduce", World: 3, Rules: w3},
		{Collective: "allreduce", World: 4, Rules: w3},
		{Collective: "allreduce", World: 6, Rules: w2}, // not a world size of t
	}
	rules := tune.PerWorldRules(&base.Topologies[0], tables)
	out, err := tune.ReplaceSelectPerWorld("s.yaml", data, "t", rules, "tuned")
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse("tuned.yaml", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	tp := s.Topologies[0]
	kept := base.Topologies[0].Select[coll.AllReduce]
	want := map[int][]spec.Rule{2: w2, 3: w3, 4: w3, 8: kept}
	if fmt.Sprint(tp.SelectByWorld[coll.AllReduce]) != fmt.Sprint(want) {
		t.Errorf("allreduce per world %v, want %v\n%s", tp.SelectByWorld[coll.AllReduce], want, out)
	}
	if tp.Select[coll.AllReduce] != nil || fmt.Sprint(tp.Select[coll.ReduceScatter]) != fmt.Sprint(base.Topologies[0].Select[coll.ReduceScatter]) {
		t.Errorf("list forms: %v", tp.Select)
	}
	for _, line := range []string{"select: # tuned\n", "      allreduce:\n        2:\n", "        3-4:\n          - {upto: 256KiB, use: oneshot}\n", "        8:\n          - {upto: 1MiB, use: oneshot}\n", "      reduce_scatter:\n        - {upto: 1MiB, use: oneshot}\n"} {
		if !strings.Contains(string(out), line) {
			t.Errorf("output lacks %q:\n%s", line, out)
		}
	}
	if a := tp.ChooseFor(coll.AllReduce, 2, 1<<20); a != "twoshot" {
		t.Errorf("world 2, 1 MiB: %q", a)
	}
}

// TestKeepSymmetric: tuning staged inputs replaces the plain rules and
// keeps the symmetric ones that still fit (bounds growing, before the
// final unbounded rule).
func TestKeepSymmetric(t *testing.T) {
	old := []spec.Rule{{UpTo: 1 << 20, Use: coll.OneShotLL}, {UpTo: 4 << 20, Use: coll.OneShot, Symmetric: true},
		{UpTo: 64 << 20, Use: coll.OneShot, Symmetric: true}, {Use: coll.OneShot, Symmetric: true}, {Use: coll.NCCL}}
	measured := []spec.Rule{{UpTo: 256 << 10, Use: coll.OneShotLL}, {UpTo: 8 << 20, Use: coll.OneShotLL128}, {Use: coll.NCCL}}
	got := tune.KeepSymmetric(measured, old)
	want := []spec.Rule{{UpTo: 256 << 10, Use: coll.OneShotLL}, {UpTo: 8 << 20, Use: coll.OneShotLL128},
		{UpTo: 64 << 20, Use: coll.OneShot, Symmetric: true}, {Use: coll.OneShot, Symmetric: true}, {Use: coll.NCCL}}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := tune.KeepSymmetric(measured, nil); !slices.Equal(got, measured) {
		t.Errorf("no symmetric rules: got %v, want %v", got, measured)
	}
}

// TestReplaceSelectKeepsTheFile: tuning one collective of the shipped spec
// rewrites that collective's entry and the select key's note only; every
// other line (blank lines, comment alignment, the other collectives'
// anchors and aliases) stays byte for byte (before, the whole file was
// re-encoded).
func TestReplaceSelectKeepsTheFile(t *testing.T) {
	data, err := os.ReadFile("../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse("collgen.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(s.Topologies, func(t spec.Topology) bool { return t.Name == "nvswitch" })
	w2 := []spec.Rule{{UpTo: 64 << 10, Use: "oneshot_ll"}, {Use: "twoshot_ll128"}}
	rules := tune.PerWorldRules(&s.Topologies[i], []tune.Table{{Collective: "allreduce", World: 2, Rules: w2}})
	out, err := tune.ReplaceSelectPerWorld("collgen.yaml", data, "nvswitch", rules, "tuned")
	if err != nil {
		t.Fatal(err)
	}
	// outside drops the nvswitch allreduce entry (from its key to the
	// reduce_scatter key after it) and marks the select key.
	outside := func(b []byte) string {
		text := string(b)
		sel := strings.Index(text, "    select:")
		from := sel + strings.Index(text[sel:], "      allreduce:\n")
		to := from + strings.Index(text[from:], "      reduce_scatter:\n")
		end := sel + strings.Index(text[sel:], "\n")
		return text[:sel] + "SELECT" + text[end:from] + "ALLREDUCE\n" + text[to:]
	}
	if a, b := outside(data), outside(out); a != b {
		t.Errorf("lines outside the tuned entry changed:\n%s", lineDiff(a, b))
	}
	if !strings.Contains(string(out), "    select: # tuned\n") {
		t.Errorf("no note on the select key")
	}
	got, err := spec.Parse("out.yaml", out)
	if err != nil {
		t.Fatal(err)
	}
	if r, want := got.Topologies[i].SelectByWorld[coll.AllReduce][2], rules[coll.AllReduce][2]; fmt.Sprint(r) != fmt.Sprint(want) {
		t.Errorf("world 2's rules %v, want %v", r, want)
	}
}

// lineDiff lists the lines where a and b differ.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var d []string
	for i := 0; i < max(len(al), len(bl)); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			d = append(d, fmt.Sprintf("%d: -%q\n%d: +%q", i+1, x, i+1, y))
		}
	}
	return strings.Join(d, "\n")
}

// An anchor on the replaced rules that another topology aliases: the
// alias keeps the old rules (before, the anchor vanished and the output
// did not load: "unknown anchor 'r' referenced").
func TestReplaceSelectAnchorUsedElsewhere(t *testing.T) {
	data := []byte(`version: 1
package: p
topologies:
  a:
    kind: nvlink_full
    world_sizes: [2]
    generate:
      allreduce: [oneshot, twoshot]
    select:
      allreduce: &r
        - {upto: 1MiB, use: oneshot}
  b:
    kind: nvlink_full
    world_sizes: [4]
    generate:
      allreduce: [oneshot, twoshot]
    select:
      allreduce: *r
`)
	out, err := tune.ReplaceSelect("s.yaml", data, "a", map[coll.Collective][]spec.Rule{coll.AllReduce: {{UpTo: 4096, Use: "twoshot"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse("s.yaml", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if a, b := s.Topologies[0].Choose(coll.AllReduce, 4096), s.Topologies[1].Choose(coll.AllReduce, 4096); a != "twoshot" || b != "oneshot" {
		t.Errorf("a chooses %s, b %s; want twoshot and oneshot\n%s", a, b, out)
	}
}
