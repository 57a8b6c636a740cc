package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/collgen/collgen/spec"
)

// TestWorkSplitOnHost compiles testdata/worksplit.cu against the header
// rendered from the shipped spec and runs it on the CPU: with the header's
// own index arithmetic (the CG_HD functions), every element of a span is
// handled by exactly one thread, in its vector's owner's warp and block,
// for any span length, so rounds of different lengths (a short last round)
// keep each element in one block and the per-block barriers order them.
// The first form of the tail spread, which gave tail element e to the
// thread of vector nvec + e and failed the GPU proof, fails here. Needs
// nvcc ($NVCC or on PATH; CI installs it before the tests); skips without.
func TestWorkSplitOnHost(t *testing.T) {
	nvcc := os.Getenv("NVCC")
	if nvcc == "" {
		var err error
		if nvcc, err = exec.LookPath("nvcc"); err != nil {
			t.Skip("no nvcc on PATH (.ci/install-cuda.sh installs one)")
		}
	}
	s, err := spec.Load("../../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, files := mustRender(t, s)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, HeaderName), files[HeaderName], 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := filepath.Abs("testdata/worksplit.cu")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "worksplit")
	if out, err := exec.Command(nvcc, "-I", dir, "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("nvcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ok ") {
		t.Fatalf("work split: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}
