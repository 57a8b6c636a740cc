package spec

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/schedule"
)

var update = flag.Bool("update", false, "rewrite testdata/bad/*.err with the errors found")

// TestBad loads every testdata/bad/<case>.yaml and compares the errors with
// <case>.err.
func TestBad(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 15 {
		t.Fatalf("only %d bad cases", len(files))
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		t.Run(name, func(t *testing.T) {
			s, err := Load(file)
			if err == nil {
				t.Fatalf("Load(%s) succeeded", file)
			}
			if s != nil {
				t.Errorf("Load(%s) returned a spec with its error", file)
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("error is %T, not ErrorList: %v", err, err)
			}
			for _, e := range list {
				if e.File != file {
					t.Errorf("error file %q, want %q", e.File, file)
				}
			}
			got := err.Error() + "\n"
			golden := strings.TrimSuffix(file, ".yaml") + ".err"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./spec -run TestBad -update)", err)
			}
			if got != string(want) {
				t.Errorf("errors differ\n--- got\n%s--- want\n%s", got, want)
			}
		})
	}
}

// TestManyErrorsAtOnce checks that errors are all reported, sorted.
func TestManyErrorsAtOnce(t *testing.T) {
	_, err := Load("testdata/bad/many_errors.yaml")
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("want ErrorList, got %v", err)
	}
	if len(list) < 8 {
		t.Errorf("got %d errors, want at least 8:\n%v", len(list), err)
	}
	if !slices.IsSortedFunc(list, func(a, b *Error) int {
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Col - b.Col
	}) {
		t.Errorf("errors not sorted:\n%v", err)
	}
}

// TestShipped loads the shipped spec and checks facts about it.
func TestShipped(t *testing.T) {
	s, err := Load("collgen.yaml")
	if err != nil {
		t.Fatalf("shipped spec: %v", err)
	}
	if s.Version != 1 || s.Package != "collectives" {
		t.Errorf("version %d package %q", s.Version, s.Package)
	}
	if !reflect.DeepEqual(s.Ops, []coll.Op{coll.Sum, coll.Max, coll.Min}) {
		t.Errorf("ops %v", s.Ops)
	}
	if !reflect.DeepEqual(s.DTypes.Reduce, []coll.DType{coll.F32, coll.F16, coll.BF16}) {
		t.Errorf("reduce dtypes %v", s.DTypes.Reduce)
	}
	var names []string
	for _, tp := range s.Topologies {
		names = append(names, tp.Name)
	}
	if !reflect.DeepEqual(names, []string{"hcm8", "host", "nvswitch", "pcie"}) {
		t.Errorf("topologies %v, want sorted by name", names)
	}
	host := s.Topology("host")
	if host == nil || len(host.WorldSizes) != 64 || host.WorldSizes[0] != 1 || host.WorldSizes[63] != 64 {
		t.Errorf("host world sizes %v, want 1..64", host.WorldSizes)
	}
	if !slices.Contains(host.DTypes.Reduce, coll.F64) || !slices.Contains(host.DTypes.Reduce, coll.I64) {
		t.Errorf("host reduce dtypes %v, want its own list", host.DTypes.Reduce)
	}
	nv := s.Topology("nvswitch")
	if !reflect.DeepEqual(nv.WorldSizes, []int{2, 3, 4, 8}) {
		t.Errorf("nvswitch world sizes %v", nv.WorldSizes)
	}
	if nv.Link == nil || nv.Link.BandwidthGBps != 478 || nv.Link.LatencyUS != 0.74 {
		t.Errorf("nvswitch link %+v", nv.Link)
	}
	if s.Topology("hcm8").Link != nil {
		t.Errorf("hcm8 has a link it did not declare")
	}
	if !reflect.DeepEqual(nv.DTypes, s.DTypes) {
		t.Errorf("nvswitch dtypes %v, want the spec's %v", nv.DTypes, s.DTypes)
	}
	if !reflect.DeepEqual(nv.Generate[coll.AllReduce], []coll.Algorithm{coll.OneShot, coll.TwoShot, coll.OneShotLL, coll.TwoShotLL, coll.OneShotLL128, coll.TwoShotLL128}) {
		t.Errorf("nvswitch generate %v", nv.Generate)
	}
	// The thresholds are tuned from measurements (docs/performance.md,
	// docs/topology.md), per world size, so this checks their shape, not
	// their values: every world size has rules, increasing bounds, each
	// rule a generated algorithm, coll.NCCL last, and ChooseFor (staged
	// inputs: the plain rules) following them; symmetric rules read in
	// place; world 2 has rules of its own.
	for _, c := range coll.Collectives() {
		for _, w := range nv.WorldSizes {
			var rules []Rule
			for _, r := range nv.SelectByWorld[c][w] {
				if !r.Symmetric {
					rules = append(rules, r)
				} else if r.Use != coll.OneShot {
					t.Errorf("nvswitch %s world %d symmetric rule %+v: want the in-place one-shot", c, w, r)
				}
			}
			// The last rule takes every size: NCCL, or an algorithm that
			// runs large messages in rounds (a barrier one, or a push one
			// whose schedule allows rounds).
			if len(rules) == 0 {
				t.Errorf("nvswitch %s world %d has no rules for staged inputs", c, w)
				continue
			}
			last := rules[len(rules)-1]
			rounds := last.Use == coll.NCCL
			if sc, err := schedule.Build(c, last.Use, w); err == nil {
				rounds = schedule.RoundsSafe(sc)
			}
			if last.UpTo != 0 || !rounds {
				t.Errorf("nvswitch %s rules at world %d %v do not end in an unbounded rule for nccl or an algorithm with rounds", c, w, rules)
				continue
			}
			for i, r := range rules[:len(rules)-1] {
				if i > 0 && r.UpTo <= rules[i-1].UpTo {
					t.Errorf("nvswitch %s world %d rule %d bound %d does not grow", c, w, i, r.UpTo)
				}
				if !slices.Contains(nv.Generate[c], r.Use) {
					t.Errorf("nvswitch %s world %d rule %d uses %s, which is not generated", c, w, i, r.Use)
				}
				if got := nv.ChooseFor(c, w, r.UpTo); got != r.Use {
					t.Errorf("ChooseFor(%s, %d, %d) = %q, want %q", c, w, r.UpTo, got, r.Use)
				}
				if got, want := nv.ChooseFor(c, w, r.UpTo+1), rules[i+1].Use; got != want {
					t.Errorf("ChooseFor(%s, %d, %d) = %q, want %q", c, w, r.UpTo+1, got, want)
				}
			}
		}
		if reflect.DeepEqual(nv.SelectByWorld[c][2], nv.SelectByWorld[c][4]) {
			t.Errorf("nvswitch %s: world 2 has world 4's rules %v, want its own", c, nv.SelectByWorld[c][2])
		}
	}
	if got := s.Topology("hcm8").Choose(coll.ReduceScatter, 1); got != coll.NCCL {
		t.Errorf("hcm8 reduce_scatter chooses %q, want nccl", got)
	}
	if got := s.Launch(coll.AllReduce, "twoshot"); got != (Launch{Threads: 512, MaxBlocks: 128, VectorBytes: 16}) {
		t.Errorf("twoshot launch %+v", got)
	}
	if got := s.Launch(coll.AllGather, "nosuch"); got != DefaultLaunch() {
		t.Errorf("undeclared launch %+v, want defaults", got)
	}
	var algs []string
	for _, a := range s.Algorithms {
		algs = append(algs, string(a.Collective)+"/"+string(a.Name))
	}
	if want := []string{"allreduce/hcm", "allreduce/oneshot", "allreduce/oneshot_ll", "allreduce/oneshot_ll128", "allreduce/twoshot",
		"allreduce/twoshot_ll", "allreduce/twoshot_ll128", "reduce_scatter/oneshot", "reduce_scatter/oneshot_ll", "reduce_scatter/oneshot_ll128",
		"allgather/oneshot", "allgather/oneshot_ll", "allgather/oneshot_ll128"}; !reflect.DeepEqual(algs, want) {
		t.Errorf("algorithms %v, want %v", algs, want)
	}
	if len(s.Sources) != 1 || s.Sources[0].Path != "collgen.yaml" || len(s.Sources[0].Content) == 0 {
		t.Errorf("sources %v", s.Sources)
	}
}

// TestLoadDir loads a directory holding collgen.yaml.
func TestLoadDir(t *testing.T) {
	s, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Sources) != 1 || s.Sources[0].Path != "collgen.yaml" {
		t.Errorf("sources %v", s.Sources[0].Path)
	}
	if _, err := Load("testdata/nosuch"); err == nil || !strings.HasPrefix(err.Error(), "spec stat testdata/nosuch") {
		t.Errorf("Load of a missing path: %v", err)
	}
}

// TestLoadEndless: a spec path that never ends (/dev/zero) is refused
// after the size limit is read, not read until memory runs out.
func TestLoadEndless(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip(err)
	}
	_, err := Load("/dev/zero")
	if err == nil || !strings.Contains(err.Error(), "more than the 4194304 bytes a spec may have") {
		t.Errorf("Load(/dev/zero) = %v", err)
	}
}

// TestMinimal checks defaults: omitted dtypes, ops, algorithms, launch
// fields, select; a bounded last rule gets an nccl tail.
func TestMinimal(t *testing.T) {
	src := `version: 1
package: coll
x-gpu: &gpu {kind: nvlink_full, world_sizes: [2-4]}
algorithms:
  allreduce:
    twoshot:
    oneshot: {threads: 256}
topologies:
  z:
    kind: pcie_p2p
    world_sizes: ["2-4", 2, 8, "6"]
    generate: {allreduce: [oneshot]}
    select: {allreduce: [{upto: 1000, use: oneshot}], allgather: [{use: nccl}]}
  a:
    <<: *gpu
    world_sizes: [8]
    dtypes: {copy: [e4m3]}
    generate: {allgather: [oneshot]}
`
	s, err := Parse("min.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s.Ops, coll.Ops()) || len(s.DTypes.Copy) != 5 {
		t.Errorf("defaults: ops %v dtypes %v", s.Ops, s.DTypes)
	}
	z, a := s.Topology("z"), s.Topology("a")
	if !reflect.DeepEqual(z.WorldSizes, []int{2, 3, 4, 6, 8}) {
		t.Errorf("world sizes %v", z.WorldSizes)
	}
	if !reflect.DeepEqual(z.Select[coll.AllReduce], []Rule{{UpTo: 1000, Use: "oneshot"}, {Use: coll.NCCL}}) {
		t.Errorf("select %v", z.Select)
	}
	if !reflect.DeepEqual(a.DTypes, DTypes{Reduce: s.DTypes.Reduce, Copy: []coll.DType{coll.E4M3}}) {
		t.Errorf("dtypes %v", a.DTypes)
	}
	if got := s.Launch(coll.AllReduce, "oneshot"); got != (Launch{Threads: 256, MaxBlocks: 24, VectorBytes: 16}) {
		t.Errorf("launch %+v", got)
	}
	want := []AlgorithmSpec{
		{coll.AllReduce, "oneshot", Launch{Threads: 256, MaxBlocks: 24, VectorBytes: 16}},
		{coll.AllReduce, "twoshot", DefaultLaunch()},
		{coll.AllGather, "oneshot", DefaultLaunch()},
	}
	if !reflect.DeepEqual(s.Algorithms, want) {
		t.Errorf("algorithms %v, want %v", s.Algorithms, want)
	}
}

func TestSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "17": 17, "1B": 1, "256KiB": 256 << 10, "10MiB": 10 << 20, "2GiB": 2 << 30,
		"1KB": 1000, "3MB": 3e6, "1GB": 1e9, "64 KiB": 64 << 10,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "KiB", "1.5MiB", "1kib", "-1", "1 TiB", "99999999999999999999", "9999999999GiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) succeeded", in)
		}
	}
	// Units beyond GiB and GB say how to write the size.
	for in, want := range map[string]string{
		"1PiB": "the largest unit is GiB; write 1048576GiB", "2TiB": "write 2048GiB", "3TB": "the largest unit is GB; write 3000GB",
		"99999999999PiB": "too large",
	} {
		if _, err := ParseSize(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSize(%q) = %v; want %q", in, err, want)
		}
	}
	for n, want := range map[int64]string{0: "0B", 1000: "1000B", 1024: "1KiB", 10 << 20: "10MiB", 3 << 30: "3GiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSuggest(t *testing.T) {
	for _, c := range []struct{ word, want string }{
		{"oneshto", "oneshot"}, {"wold_sizes", "world_sizes"}, {"F32", "f32"}, {"twoshot", ""}, {"zzzzzz", ""},
	} {
		if got := suggest(c.word, []string{"oneshot", "twoshot", "world_sizes", "f32"}); got != c.want {
			t.Errorf("suggest(%q) = %q, want %q", c.word, got, c.want)
		}
	}
}

// FuzzParse checks that Parse never panics and that its results are
// consistent: a spec or an ErrorList with positions, never both.
func FuzzParse(f *testing.F) {
	shipped, err := os.ReadFile("collgen.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(shipped)
	if bad, err := os.ReadFile("testdata/bad/many_errors.yaml"); err == nil {
		f.Add(bad)
	}
	f.Add([]byte("version: 1\nx: &a [*a]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if (s == nil) == (err == nil) {
			t.Fatalf("spec %v and error %v", s != nil, err)
		}
		if err != nil {
			var list ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("error %T %v is not a non-empty ErrorList", err, err)
			}
			_ = err.Error()
			return
		}
		for _, tp := range s.Topologies {
			if len(tp.WorldSizes) == 0 || !slices.IsSorted(tp.WorldSizes) {
				t.Fatalf("topology %s world sizes %v", tp.Name, tp.WorldSizes)
			}
			for c, rules := range tp.Select {
				if len(rules) == 0 || rules[len(rules)-1].UpTo != 0 {
					t.Fatalf("topology %s select %s %v not total", tp.Name, c, rules)
				}
			}
		}
	})
}

func BenchmarkParseShipped(b *testing.B) {
	data, err := os.ReadFile("collgen.yaml")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Parse("collgen.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCheckPackageSuggestsWorkingNames: the name CheckPackage suggests is
// one it accepts ("Main" suggested main, which it then refused), and a
// non-ASCII name is refused (Go accepts the identifier, not the import
// path holding it), as is one longer than a directory name can be (the
// spec loaded, and generate failed after rendering with "file name too
// long", without a position or a fix).
func TestCheckPackageSuggestsWorkingNames(t *testing.T) {
	for _, name := range []string{"Main", "MAIN", "Cuda", "äbc", "9lives", strings.Repeat("x", 256), strings.Repeat("X", 300)} {
		err := CheckPackage(name)
		var pe *PackageError
		if !errors.As(err, &pe) {
			t.Errorf("CheckPackage(%q) = %v; want a *PackageError", name, err)
			continue
		}
		i := strings.LastIndex(pe.Msg, "write package: ")
		if i < 0 {
			t.Errorf("CheckPackage(%q): %q suggests nothing", name, pe.Msg)
			continue
		}
		if s := pe.Msg[i+len("write package: "):]; CheckPackage(s) != nil {
			t.Errorf("CheckPackage(%q) suggests %q, which it refuses: %v", name, s, CheckPackage(s))
		}
	}
}
