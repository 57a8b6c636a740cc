package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/collgen/collgen/runtime/shm"
)

// TestSweepBenchDirs: a directory of a killed bench (its pid gone, this
// pid namespace) is removed; a live bench's, another namespace's and
// other names are kept.
func TestSweepBenchDirs(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	dead := cmd.Process.Pid // reaped: gone unless the pid was reused at once
	ns := shm.PIDNamespace()
	if ns == 0 {
		t.Skip("no pid namespace id")
	}
	dir := t.TempDir()
	names := map[string]bool{ // name: kept
		fmt.Sprintf("collgen-bench-%d-%d-abc", ns, dead):           false,
		fmt.Sprintf("collgen-bench-%d-%d-def", ns, os.Getpid()):    true,
		fmt.Sprintf("collgen-bench-%d-%d-ghi", ns+1, dead):         true,
		fmt.Sprintf("collgen-bench-%d-%d-jkl-not-a-dir", ns, dead): true,
		"collgen-bench-old": true,
	}
	for n := range names {
		path := filepath.Join(dir, n)
		var err error
		if n == fmt.Sprintf("collgen-bench-%d-%d-jkl-not-a-dir", ns, dead) {
			err = os.WriteFile(path, nil, 0o644)
		} else {
			err = os.MkdirAll(filepath.Join(path, "store"), 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	sweepBenchDirs(dir)
	for n, kept := range names {
		_, err := os.Stat(filepath.Join(dir, n))
		if got := err == nil; got != kept {
			t.Errorf("%s: kept %v, want %v", n, got, kept)
		}
	}
}
