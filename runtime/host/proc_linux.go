package host

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// processGone reports whether pid no longer runs: kill(pid, 0) fails with
// ESRCH, or /proc says it is a zombie (killed but not yet reaped by its
// parent, which is common when the parent is the launcher).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return os.IsNotExist(err)
	}
	// Format: pid (comm) state ...; comm may hold spaces and parens, so
	// take the state after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st == 'Z' || st == 'X'
}
