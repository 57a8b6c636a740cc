// Package fdpasstest starts a copy of the running test binary as another
// user, for tests of what a process of another user gets from a socket
// that must refuse it.
package fdpasstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Nobody is the uid and gid the copy runs as.
const Nobody = 65534

// AsNobody returns a command that runs a copy of this test binary as user
// nobody with args and the environment plus env. It skips t unless the
// test runs as root (only root may start a process of another user). The
// copy lives in a temporary directory nobody may enter, removed when t
// ends.
func AsNobody(t testing.TB, args []string, env ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a process of another user")
	}
	dir, err := os.MkdirTemp("", "collgen-foreign-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, filepath.Base(os.Args[0]))
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: Nobody, Gid: Nobody}}
	return cmd
}
