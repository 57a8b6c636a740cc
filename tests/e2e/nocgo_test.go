package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestWithoutCgo builds the CPU-only parts with CGO_ENABLED=0 (a program
// using comm on the host backend must not need a C compiler) and runs
// comm's tests of that build, which check that a GPU communicator is then
// refused with ErrUnsupported. It compiles a second build of the runtime,
// so -short skips it.
func TestWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the runtime again with CGO_ENABLED=0")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH")
	}
	env := append(os.Environ(), "CGO_ENABLED=0")
	for _, args := range [][]string{
		{"build", "./coll", "./generated/...", "./runtime/comm", "./runtime/host", "./runtime/kernels", "./runtime/rendezvous", "./runtime/shm", "./runtime/cuda"},
		{"vet", "./runtime/comm", "./runtime/cuda", "./tests/e2e"},
		{"test", "-count=1", "-run", "TestGPUNeedsCgo|TestNoGPUSaysWhatToSet|TestHostSlices", "./runtime/comm"},
	} {
		cmd := exec.Command(gobin, args...)
		cmd.Dir, cmd.Env = "../..", env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("CGO_ENABLED=0 go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
