package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/collgen/collgen/spec"
)

// nvccOrSkip is $NVCC, else nvcc on PATH; it skips the test without one.
func nvccOrSkip(t *testing.T) string {
	t.Helper()
	if nvcc := os.Getenv("NVCC"); nvcc != "" {
		return nvcc
	}
	nvcc, err := exec.LookPath("nvcc")
	if err != nil {
		t.Skip("no nvcc on PATH (.ci/install-cuda.sh installs one)")
	}
	return nvcc
}

// renderedHeader writes the header rendered from the shipped spec into a
// temporary directory and returns the directory.
func renderedHeader(t *testing.T) string {
	t.Helper()
	s, err := spec.Load("../../spec/collgen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, files := mustRender(t, s)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, HeaderName), files[HeaderName], 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

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
	nvcc := nvccOrSkip(t)
	dir := renderedHeader(t)
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

// TestGPUProbesCompile: the one-GPU probe that calls the header's own
// functions (tests/gpu/ll128_offset_probe.cu) still compiles against the
// rendered header for sm_90, so a header change that breaks it shows here
// and not on the next lent GPU.
func TestGPUProbesCompile(t *testing.T) {
	nvcc := nvccOrSkip(t)
	dir := renderedHeader(t)
	src, err := filepath.Abs("../../tests/gpu/ll128_offset_probe.cu")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(nvcc, "-arch=sm_90", "-std=c++17", "-I", dir, "-o", filepath.Join(dir, "probe"), src).CombinedOutput()
	if err != nil {
		t.Fatalf("nvcc %s: %v\n%s", src, err, out)
	}
}
