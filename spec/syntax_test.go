package spec

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

// head is what most real specs start with: comment lines, then version.
const head = "# a spec\n# more comment\nversion: 1\n"

// TestSyntaxErrorPositions: YAML syntax errors point at the line and
// column of the problem, not at the construct enclosing it (yaml.v3's own
// line is that construct's, 0-based: a comment line for most specs).
func TestSyntaxErrorPositions(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, pos, msg string
	}{
		{"value in wrong place", head + "topologies:\n  pcie:\n    kind: pcie_p2p\n     world_sizes: [2]\n", "7:17", "mapping values are not allowed"},
		{"unclosed flow sequence", head + "topologies:\n  pcie:\n    kind: pcie_p2p\n    world_sizes: [2\n    generate: x\n", "7:19", "did not find expected ',' or ']'"},
		{"unclosed quote", head + "topologies:\n  pcie:\n    kind: \"pcie_p2p\n    world_sizes: [2]\n", "6:11", "found unexpected end of stream"},
		{"stray scalar", head + "topologies:\n  pcie:\n    kind: pcie_p2p\n  bad\n    world_sizes: [2]\n", "7:3", "could not find expected ':'"},
		{"tab indent", head + "topologies:\n\tpcie:\n    kind: pcie_p2p\n", "5:1", "found character that cannot start any token"},
		{"two colons", head + "package: a: b\n", "4:11", "mapping values are not allowed"},
		{"list then mapping", head + "topologies:\n  - a\n  b: c\n", "6:4", "did not find expected '-' indicator"},
		{"unclosed flow mapping", head + "topologies: {a: 1, b\n", "4:20", "did not find expected ',' or '}'"},
		{"unknown anchor", head + "x: &a 1\ny: *b\n", "5:5", "unknown anchor 'b' referenced"},
		{"extra bracket", head + "topologies:\n  pcie:\n    kind: pcie_p2p\n    world_sizes: [2]]\n", "7:21", "did not find expected key"},
		{"indented key", head + "  package: x\n", "4:10", "mapping values are not allowed"},
		{"single quote", head + "key: 'unterminated\nother: 2\n", "4:6", "found unexpected end of stream"},
		// A quote opened in a flow mapping and closed by an apostrophe in a
		// comment further down: the error is where the quote opened.
		{"quote closed in a comment", head + "launch:\n  oneshot: {threads: 'x}\n  twoshot: {threads: 512}\n  # the one-shot's rule\n", "5:22", "a quote or bracket opened here is still open there"},
		{"at sign", head + "key: @x\n", "4:6", "cannot start any token"},
		{"backquote", head + "key: `x\n", "4:6", "cannot start any token"},
		{"sequence after complex key", head + "? complex\n: x\n- y\n", "6:1", "did not find expected key"},
		{"dedented key", head + "algorithms:\n  oneshot:\n    threads: 512\n   blocks: 4\n", "7:4", "did not find expected key"},
		{"wrong closer", head + "x: [a, b}\n", "4:8", "did not find expected ',' or ']'"},
		{"bad escape", head + "x: \"bad \\q escape\"\n", "4:9", "found unknown escape character"},
		{"block scalar dedent", head + "x: |\n  a\n b\n", "6:2", "did not find expected key"},
		{"deep flow nesting", head + "x: " + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + "\n", "4:36", "nested more than 32 levels deep"},
		{"deep block nesting", head + strings.Repeat("a:\n", 1) + func() string {
			var b strings.Builder
			for i := 1; i <= 40; i++ {
				b.WriteString(strings.Repeat(" ", i) + "a:\n")
			}
			return b.String()
		}(), "35:32", "nested more than 32 levels deep"},
		{"binary", "\xff\xfe\x00garbage", "1:1", "byte 0xff is not UTF-8"},
		{"NUL", head + "x: a\x00b\n", "4:5", "control character U+0000"},
		{"bell", head + "x: a\x07b\n", "4:5", "control character U+0007"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := Parse("s.yaml", []byte(tc.yaml))
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Parse took %v", d)
			}
			var list ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("Parse = %v, want an ErrorList", err)
			}
			e := list[0]
			if got := fmt.Sprintf("%d:%d", e.Line, e.Col); got != tc.pos || !strings.Contains(e.Msg, tc.msg) {
				t.Fatalf("got %s: %s\nwant %s: ...%s...", got, e.Msg, tc.pos, tc.msg)
			}
		})
	}
}

// TestMutatedSpecErrorLines breaks the shipped spec at random places (a
// character inserted, deleted or replaced by one YAML cares about) and
// checks every error: it has a position, that position is on a line that
// exists and is not a comment, and a syntax error is never reported before
// the line that was broken (everything above it is unchanged, valid YAML).
func TestMutatedSpecErrorLines(t *testing.T) {
	orig, err := os.ReadFile("collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	special := []byte(":[]{}-\t\"'&*!|>%@`#,? \n")
	rng := rand.New(rand.NewPCG(1, 2))
	n := 300
	if testing.Short() {
		n = 60
	}
	syntax := 0
	for i := range n {
		b := bytes.Clone(orig)
		at := rng.IntN(len(b))
		c := special[rng.IntN(len(special))]
		switch i % 3 {
		case 0:
			b = append(b[:at], append([]byte{c}, b[at:]...)...)
		case 1:
			b = append(b[:at], b[at+1:]...)
		default:
			b[at] = c
		}
		mutLine := bytes.Count(orig[:at], []byte("\n")) + 1
		_, err := Parse("s.yaml", b)
		if err == nil {
			continue
		}
		var list ErrorList
		if !errors.As(err, &list) {
			t.Fatalf("mutation %d: %T %v", i, err, err)
		}
		blines := strings.Split(string(b), "\n")
		for _, e := range list {
			if e.Line < 1 || e.Line > len(blines) || e.Col < 1 {
				t.Errorf("mutation %d (line %d): error without a valid position: %v", i, mutLine, e)
				continue
			}
			if l := strings.TrimSpace(blines[e.Line-1]); strings.HasPrefix(l, "#") && strings.Contains(e.Msg, "YAML syntax error") {
				t.Errorf("mutation %d (line %d): syntax error on a comment line: %v", i, mutLine, e)
			}
			if strings.Contains(e.Msg, "YAML syntax error") {
				syntax++
				if e.Line < mutLine {
					t.Errorf("mutation %d (line %d, %q): syntax error reported above the change: %v", i, mutLine, c, e)
				}
			}
		}
	}
	if syntax < n/10 {
		t.Fatalf("only %d syntax errors in %d mutations: the test does not exercise the locator", syntax, n)
	}
}

// TestRandomBytesGetAPosition: any input, however broken, yields errors
// with a line and column, quickly.
func TestRandomBytesGetAPosition(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		b := make([]byte, rng.IntN(400))
		for j := range b {
			if i%2 == 0 {
				b[j] = byte(rng.IntN(256))
			} else {
				b[j] = " \n:-[]{}ab#'\"\t"[rng.IntN(14)]
			}
		}
		start := time.Now()
		_, err := Parse("r.yaml", b)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("input %d took %v", i, d)
		}
		var list ErrorList
		if !errors.As(err, &list) {
			t.Fatalf("input %d: %T %v", i, err, err)
		}
		for _, e := range list {
			if e.Line < 1 || e.Col < 1 {
				t.Fatalf("input %d %q: error without a position: %v", i, b, e)
			}
		}
	}
}

// TestMergeFanOutIsLinear: a spec of under a kilobyte that merges a
// mapping through 7 levels of 20 aliases each loads with a few hundred
// mapping walks, not 20^7 (it ran for minutes: each alias was walked
// again). Merging one mapping twice adds nothing, so each is walked once.
func TestMergeFanOutIsLinear(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\npackage: p\nx-m0: &m0 {kind: nvlink_full, world_sizes: [2], generate: {allreduce: [oneshot]}}\n")
	for i := 1; i <= 7; i++ {
		fmt.Fprintf(&b, "x-m%d: &m%d {<<: [%s]}\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*m%d, ", i-1), 20), ", "))
	}
	b.WriteString("topologies: {nv: {<<: *m7}}\n")
	if b.Len() > 1200 {
		t.Fatalf("the spec is %d bytes", b.Len())
	}
	l := &loader{file: "fanout.yaml"}
	s := l.parse([]byte(b.String()))
	if len(l.errs) > 0 || s == nil {
		t.Fatalf("errors: %v", l.errs)
	}
	if l.walks > 1000 {
		t.Errorf("%d mapping walks for a %d-byte spec; want them linear in its size", l.walks, b.Len())
	}
}

// TestOneRuleWithoutBrackets: a select entry written as one rule without
// its list brackets says so (it reported "key "upto" is not a world size"
// and the same for "use").
func TestOneRuleWithoutBrackets(t *testing.T) {
	src := "version: 1\npackage: p\ntopologies:\n  nv:\n    kind: nvlink_full\n    world_sizes: [2]\n    generate: {allreduce: [oneshot]}\n    select: {allreduce: {upto: 1, use: oneshot}}\n"
	_, err := Parse("one.yaml", []byte(src))
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 1 || !strings.Contains(list[0].Error(), "is a list of rules, not one rule") {
		t.Errorf("got %v; want one error saying the entry is a list of rules", err)
	}
}

// TestMinThreadsAfterBadThreads: a threads value out of range is the one
// error; min_threads is not then checked against the default that stood
// in for it (a second error told to write min_threads: 512).
func TestMinThreadsAfterBadThreads(t *testing.T) {
	src := "version: 1\npackage: p\nalgorithms:\n  allreduce:\n    oneshot: {threads: 2000, min_threads: 1024}\ntopologies:\n  nv:\n    kind: nvlink_full\n    world_sizes: [2]\n    generate: {allreduce: [oneshot]}\n"
	_, err := Parse("mt.yaml", []byte(src))
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 1 || !strings.Contains(list[0].Error(), "threads 2000") {
		t.Errorf("got %v; want the one threads error", err)
	}
}

// TestTabIndentSaysUseSpaces: a tab that indents a line (editors insert
// them) is a YAML syntax error whose own message, "found character that
// cannot start any token", does not say what to write instead; the error
// names the tab and says to indent with spaces.
func TestTabIndentSaysUseSpaces(t *testing.T) {
	for _, yaml := range []string{
		head + "topologies:\n\tpcie:\n    kind: pcie_p2p\n",
		head + "topologies:\n  pcie:\n  \tkind: pcie_p2p\n",
	} {
		_, err := Parse("s.yaml", []byte(yaml))
		var list ErrorList
		if !errors.As(err, &list) || len(list) == 0 {
			t.Fatalf("Parse = %v, want an ErrorList", err)
		}
		if msg := list[0].Error(); !strings.Contains(msg, "tab") || !strings.Contains(msg, "spaces") {
			t.Errorf("%q: %s; want it to name the tab and say to indent with spaces", yaml, msg)
		}
	}
}
