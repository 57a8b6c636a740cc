package cuda

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/plan"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/spec"
)

// kernelHead matches a generated kernel's signature and the first line of
// its body.
var kernelHead = regexp.MustCompile(`(?m)^(\w+)\(const CG_GRID_CONSTANT collgen_args_w\d+ a\) \{\n  (.*)\n`)

// TestKernelsWaitForThePreviousKernel: every kernel of the shipped spec
// takes its arguments as a grid constant and opens with cg_grid_wait, so
// a kernel launched early (programmatic dependent launch) touches no
// memory before the kernel ahead of it on the stream has finished.
func TestKernelsWaitForThePreviousKernel(t *testing.T) {
	p, files := renderShipped(t)
	push := map[string]bool{} // program name -> its kernels push
	for _, pr := range p.Programs {
		push[pr.Name] = pr.Kernels[0].Schedule.Protocol.Push()
	}
	n := 0
	for name, src := range files {
		if !strings.HasSuffix(name, ".cu") {
			continue
		}
		n++
		m := kernelHead.FindStringSubmatch(string(src))
		if m == nil {
			t.Errorf("%s: no kernel taking `const CG_GRID_CONSTANT collgen_args_wN a`", name)
			continue
		}
		want := "cg_grid_wait();" // barrier kernels
		if push[m[1]] {
			want = "cg_grid_begin();" // push kernels also launch the next kernel at once
		}
		if m[2] != want {
			t.Errorf("%s: kernel %s opens with %q, want %s", name, m[1], m[2], want)
		}
	}
	if n != len(p.Programs) {
		t.Errorf("%d kernel files for %d programs", n, len(p.Programs))
	}
}

// TestPushRoundsCoverWholeWindows: in the rounds loop of a push kernel,
// every loop that puts or polls an inbox covers the whole window
// (cg_round_n), not just the span's data. The order that keeps a round's
// puts off lines a peer has not yet read runs through each thread's next
// round (schedule.SimulateWindows proves it for rounds in which every
// thread works); a thread idle in a short last round would leave its last
// read unordered against the next collective's first puts.
func TestPushRoundsCoverWholeWindows(t *testing.T) {
	_, files := renderShipped(t)
	kernelsWithRounds := 0
	for name, src := range files {
		_, body, ok := strings.Cut(string(src), "for (cg_u64 r = 0, w0 = 0;")
		if !ok {
			continue
		}
		kernelsWithRounds++
		loops := 0
		for _, block := range strings.Split(body, "\n  { // ")[1:] {
			if !strings.Contains(block, "PR::store(") && !strings.Contains(block, "PR::poll(") && !strings.Contains(block, "cg_push_wait<PR>(") {
				continue
			}
			loops++
			if !strings.Contains(block, "const cg_s64 units = PR::units<E>(cg_round_n(sp.n, a.chunk, win));") {
				t.Errorf("%s: a rounds loop that touches an inbox covers only the span's data:\n%s", name, block)
			}
		}
		if loops == 0 {
			t.Errorf("%s: rounds loop without a put or a poll", name)
		}
	}
	if kernelsWithRounds == 0 {
		t.Fatal("no push kernel with rounds in the shipped spec")
	}
}

// TestHCMPartialsStayInAccumulators: the f16 and bf16 hybrid-cube-mesh
// programs sum their quad into a scratch of A (f32, the accumulator type)
// and their final step reads A, so a 2-byte sum is rounded once; every
// other reduce, f32's hcm ones included (A is E there), goes through
// cg_reduce over E. Rounding the partials to E gave bf16 sums 2
// ulps off on a GPU (docs/numerics.md).
func TestHCMPartialsStayInAccumulators(t *testing.T) {
	_, files := renderShipped(t)
	hcm := 0
	for name, src := range files {
		text := string(src)
		if !strings.Contains(name, "_hcm_") {
			if strings.Contains(text, "cg_reduce_acc<") {
				t.Errorf("%s: reduces through an accumulator scratch; only hcm keeps partials there", name)
			}
			continue
		}
		hcm++
		wide := strings.Contains(name, "_f16_") || strings.Contains(name, "_bf16_")
		for _, want := range []string{"typedef T::A A;", "cg_reduce_acc<T, OP, 4, VB, true, false>((A*)a.scratch[rank]", "const A* const src[2]", "cg_reduce_acc<T, OP, 2, VB, false, true>((E*)a.output"} {
			if strings.Contains(text, want) != wide {
				t.Errorf("%s: %q present %v; want it only where the accumulator is wider than the dtype (f16, bf16)", name, want, !wide)
			}
		}
		if strings.Contains(text, "cg_reduce<") == wide {
			t.Errorf("%s: cg_reduce present %v; a dtype with a wider accumulator reduces through cg_reduce_acc, the others through cg_reduce", name, !wide)
		}
	}
	if hcm == 0 {
		t.Fatal("no hcm program in the shipped spec")
	}
}

// TestLL128PollsInFlightTogether: an LL128 reduce issues every inbox
// line's load (after one PR::sync) before its first flag test
// (PR::arrived) and before its other sources' loads, and no reduce polls
// with PR::poll: a poll's flag shuffle waits for its load, so polls in a
// row would each wait a memory latency for the one before (one per peer
// at world 8), and an unaligned input's shuffles would hold the poll's
// load back.
func TestLL128PollsInFlightTogether(t *testing.T) {
	s, err := spec.Load("../../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, files := mustRender(t, s)
	split := 0
	for name, src := range files {
		if !strings.Contains(string(src), "typedef cg_ll128 PR;") {
			continue
		}
		for _, block := range strings.Split(string(src), "\n  { // ")[1:] {
			if strings.Contains(block, "ok &= PR::poll(") {
				t.Errorf("%s: a reduce polls an inbox in one piece:\n%s", name, block)
			}
			loads := strings.Count(block, "PR::load(")
			if loads == 0 {
				continue
			}
			split++
			sync, firstLoad := strings.Index(block, "PR::sync();"), strings.Index(block, "PR::load(")
			lastLoad, firstTest := strings.LastIndex(block, "PR::load("), strings.Index(block, "PR::arrived(")
			ld := strings.Index(block, "= PR::ld(")
			if sync < 0 || sync > firstLoad || firstTest < lastLoad || (ld >= 0 && ld < lastLoad) || strings.Count(block, "PR::arrived(") != loads {
				t.Errorf("%s: %d loads, not all issued after one sync and before the other loads and the first flag test:\n%s", name, loads, block)
			}
		}
	}
	if split == 0 {
		t.Fatal("no LL128 reduce polls an inbox in the shipped spec")
	}
}

// TestPushLoopsStartOnWarps: every loop of a push kernel takes its first
// unit through cg_push_shift, which starts each chunk on a warp boundary
// (TestWorkSplitOnHost checks the function), so no warp runs two chunks'
// loops in a row; none multiplies the chunk index by the units itself.
func TestPushLoopsStartOnWarps(t *testing.T) {
	s, err := spec.Load("../../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, files := mustRender(t, s)
	loops := 0
	for name, src := range files {
		if !strings.Contains(string(src), "typedef cg_ll") {
			continue // not a push program
		}
		for _, line := range strings.Split(string(src), "\n") {
			if !strings.Contains(line, "for (cg_s64 u = cg_first(") {
				continue
			}
			loops++
			if !strings.Contains(line, "cg_first(cg_push_shift(") {
				t.Errorf("%s: a push loop not started through cg_push_shift:\n%s", name, line)
			}
		}
	}
	if loops == 0 {
		t.Fatal("no push loop in the shipped spec")
	}
}

// TestProgramsServeTheirKernels checks how a program reads what its
// kernels differ in: one serving several ops takes the op from args.op
// (cg_op), one serving a single op uses that op's struct, and a copying
// one moves the bits of its element size (cg_bits).
func TestProgramsServeTheirKernels(t *testing.T) {
	s, err := spec.Load("../../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		only, file string
		want       []string
	}{
		{"allreduce_twoshot_ll_f16_*_w4", "allreduce_twoshot_ll_f16_w4.cu",
			[]string{"typedef cg_op OP;", "const OP op{a.op};", "PR::reduce<T>(xs, op)", "f16, sum, max or min (args.op)"}},
		{"allreduce_twoshot_f16_max_w4", "allreduce_twoshot_f16_w4.cu",
			[]string{"typedef cg_max OP;", "const OP op{};", ", src, n, shift, op);", "f16, max,"}},
		{"allgather_oneshot_*_w4", "allgather_oneshot_u8_w4.cu",
			[]string{"typedef cg_bits<1> T;", "8-bit elements (e4m3, e5m2)"}},
	} {
		p, err := plan.New(s, plan.Options{Only: c.only})
		if err != nil {
			t.Fatal(err)
		}
		files, err := Render(p)
		if err != nil {
			t.Fatal(err)
		}
		src := string(files[c.file])
		for _, w := range c.want {
			if !strings.Contains(src, w) {
				t.Errorf("--only %s: %s lacks %q", c.only, c.file, w)
			}
		}
		if strings.Contains(src, "OP::f") || strings.Contains(c.file, "allgather") && strings.Contains(src, " OP;") {
			t.Errorf("--only %s: %s calls an op statically or a copy has one", c.only, c.file)
		}
	}
	_, files := mustRender(t, s)
	header := string(files[HeaderName])
	for _, op := range coll.Ops() {
		def := fmt.Sprintf("#define CG_OP_%s %d\n", strings.ToUpper(string(op)), kernels.OpCode(op))
		if !strings.Contains(header, def) {
			t.Errorf("header lacks %q", def)
		}
	}
}

// mustRender plans and renders s whole.
// renderShipped renders the shipped spec (spec/collgen.yaml).
func renderShipped(t *testing.T) (*plan.Plan, map[string][]byte) {
	t.Helper()
	s, err := spec.Load("../../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return mustRender(t, s)
}

func mustRender(t *testing.T, s *spec.Spec) (*plan.Plan, map[string][]byte) {
	t.Helper()
	p, err := plan.New(s, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	files, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, files
}
