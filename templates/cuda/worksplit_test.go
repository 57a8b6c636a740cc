package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/collgen/collgen/spec"
)

// buildOnHost compiles src (relative to this package) with nvcc ($NVCC,
// else nvcc on PATH; the test skips without one) against the header
// rendered from the shipped spec, with the extra flags, and returns the
// binary's path.
func buildOnHost(t *testing.T, src string, flags ...string) string {
	t.Helper()
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
	abs, err := filepath.Abs(src)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, strings.TrimSuffix(filepath.Base(src), ".cu"))
	args := append(append([]string{}, flags...), "-I", dir, "-o", bin, abs)
	if out, err := exec.Command(nvcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("nvcc %s: %v\n%s", src, err, out)
	}
	return bin
}

// TestWorkSplitOnHost compiles testdata/worksplit.cu against the header
// rendered from the shipped spec and runs it on the CPU: with the header's
// own index arithmetic (the CG_HD functions), every element of a span is
// handled by exactly one thread, in its vector's owner's warp and block,
// for any span length, so rounds of different lengths (a short last round)
// keep each element in one block and the per-block barriers order them.
// The first form of the tail spread, which gave tail element e to the
// thread of vector nvec + e and failed the GPU proof, fails here. And push
// kernels' chunks start on warp boundaries (cg_push_shift), one after the
// other without overlap (c times the units alone, the earlier form, fails).
// Needs nvcc ($NVCC or on PATH; CI installs it before the tests); skips
// without.
func TestWorkSplitOnHost(t *testing.T) {
	bin := buildOnHost(t, "testdata/worksplit.cu")
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ok ") {
		t.Fatalf("work split: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}

// TestLamportWordsOnHost compiles testdata/lamport.cu against the header
// rendered from the shipped spec and runs it on the CPU: the Lamport
// protocol's encoding (cg_lamport_encode, cg_lamport_empty), the very
// functions the kernels call, never sends an element as zero bits (which
// a reader would take for not arrived, and wait on forever), decodes
// every 16-bit pattern and 32-bit edge to itself except the all-ones NaN
// (to another NaN), and finds a word with an element not yet arrived
// empty. Needs nvcc; skips without.
func TestLamportWordsOnHost(t *testing.T) {
	bin := buildOnHost(t, "testdata/lamport.cu")
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ok ") {
		t.Fatalf("lamport words: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}

// TestGPUProbesCompile: the one-GPU probe that calls the header's own
// functions (tests/gpu/ll128_offset_probe.cu) still compiles against the
// rendered header for sm_90, so a header change that breaks it shows here
// and not on the next lent GPU.
//
// And tests/gpu/loopback.cu, which runs a generated kernel at world W on
// one GPU (here the checked-in world-2 LL128 all-reduce one-shot, with the
// checked-in header beside it, whose arguments it fills in itself): a
// change to collgen_args or to the kernels' signature breaks it here.
func TestGPUProbesCompile(t *testing.T) {
	buildOnHost(t, "../../tests/gpu/ll128_offset_probe.cu", "-arch=sm_90", "-std=c++17")
	buildOnHost(t, "../../tests/gpu/loopback.cu", "-arch=sm_90", "-std=c++17", "-DWORLD=2", "-DTHREADS=512",
		`-DKFILE="allreduce_oneshot_ll128_bf16_w2.cu"`, "-DKNAME=allreduce_oneshot_ll128_bf16_w2", "-I", "../../generated/cuda")
}
