//go:build unix

package launch

import (
	"os"
	"os/exec"
	"syscall"
)

// setProcGroup puts the rank in its own process group so that signals
// reach anything it started too (a shell wrapper's children, say). The
// terminal's Ctrl-C then reaches only collgen, which forwards it.
func setProcGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killGroup sends sig to the rank's process group.
func killGroup(cmd *exec.Cmd, sig os.Signal) {
	if cmd.Process == nil {
		return
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		s = syscall.SIGINT
	}
	syscall.Kill(-cmd.Process.Pid, s)
}
