//go:build unix

package launch

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// setProcGroup puts the rank in its own process group so that signals
// reach anything it started too (a shell wrapper's children, say). The
// terminal's Ctrl-C then reaches only collgen, which forwards it. On Linux
// the rank also gets SIGKILL should the launcher die (see setDeathSignal).
func setProcGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setDeathSignal(cmd.SysProcAttr)
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

// continueGroup sends SIGCONT to the rank's process group, so a stopped
// rank handles the signal it was just sent.
func continueGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	}
}

// fdsPerRank is what one running rank costs the launcher in file
// descriptors (its stdout and stderr pipes, a pidfd, and the transient
// ends while starting), with room to spare.
const fdsPerRank = 4

// checkFDs refuses a group the file-descriptor limit cannot hold, before
// any rank starts.
func checkFDs(n int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil
	}
	need := uint64(n)*fdsPerRank + 64
	if lim.Cur != ^uint64(0) && need > lim.Cur {
		return fmt.Errorf("%w: %d ranks need about %d file descriptors, and the limit is %d (raise it with ulimit -n, or start fewer ranks)", ErrTooManyRanks, n, need, lim.Cur)
	}
	return nil
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGILL: "SIGILL",
	syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE",
	syscall.SIGKILL: "SIGKILL", syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM", syscall.SIGXCPU: "SIGXCPU",
	syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
}

// SignalName names a signal the way kill(1) does: "SIGKILL", "SIGTERM";
// unknown signals read "signal N".
func SignalName(sig os.Signal) string {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Sprint(sig)
	}
	if n, ok := signalNames[s]; ok {
		return n
	}
	return fmt.Sprintf("signal %d", int(s))
}

// processGone reports whether no process has pid (kill(pid, 0) says ESRCH).
func processGone(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == syscall.ESRCH
}
