package pause

import (
	"syscall"
	"time"
)

// short sleeps the thread with nanosleep, again for what is left when a
// signal interrupts it (the Go runtime's preemption signals do).
func short(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var left syscall.Timespec
		if err := syscall.Nanosleep(&ts, &left); err != syscall.EINTR {
			return
		}
		ts = left
	}
}
