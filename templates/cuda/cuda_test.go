package cuda

import (
	"regexp"
	"strings"
	"testing"

	"github.com/collgen/collgen/plan"
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
	s, err := spec.Load("../../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.New(s, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	files, err := Render(p)
	if err != nil {
		t.Fatal(err)
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
		if strings.Contains(m[1], "_ll") {
			want = "cg_grid_begin();" // push kernels also launch the next kernel at once
		}
		if m[2] != want {
			t.Errorf("%s: kernel %s opens with %q, want %s", name, m[1], m[2], want)
		}
	}
	if n != len(p.Kernels) {
		t.Errorf("%d kernel files for %d kernels", n, len(p.Kernels))
	}
}
