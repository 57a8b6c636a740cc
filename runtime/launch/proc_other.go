//go:build !unix

package launch

import (
	"fmt"
	"os"
	"os/exec"
)

func setProcGroup(cmd *exec.Cmd) {}

// killGroup signals the rank itself; without process groups its children
// are not reached.
func killGroup(cmd *exec.Cmd, sig os.Signal) {
	if cmd.Process == nil {
		return
	}
	if cmd.Process.Signal(sig) != nil {
		cmd.Process.Kill()
	}
}

func checkFDs(n int) error { return nil }

// SignalName names a signal.
func SignalName(sig os.Signal) string { return fmt.Sprint(sig) }

// processGone cannot tell here, so it says no: stale runs are kept.
func processGone(pid int) bool { return false }

// continueGroup does nothing: there is no SIGSTOP to undo.
func continueGroup(cmd *exec.Cmd) {}
