//go:build linux

package host

import (
	"fmt"
	"syscall"
	"time"
	"unsafe"
)

// Futex operations without FUTEX_PRIVATE_FLAG: the kernel keys a shared
// futex by the page behind the address, not by the address in one process,
// so a waiter blocked on a peer's counter through its read-only mapping
// and the peer waking it through its own read-write mapping meet on the
// same key (FUTEX_WAIT and FUTEX_WAKE only need read access since Linux
// 3.1). It serves goroutine ranks on POSIX segments alike; goroutine ranks
// on ordinary memory park in the Go scheduler instead (park in wait.go).
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait blocks while the low 32 bits of *addr equal uint32(val), for
// at most d. The kernel compares the word and queues the caller atomically
// with respect to futexWake on the same word, which is what rules out a
// lost wake-up (see wait.go). It returns nil when woken, when the word
// already differed, on timeout or on a signal (Go's preemption signals
// interrupt the call): the caller re-reads the word in every case. Any
// other error (a bad address, a kernel without futexes) is returned.
func futexWait(addr *uint64, val uint64, d time.Duration) error {
	ts := syscall.NsecToTimespec(max(int64(d), 1))
	_, _, e := syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(futexWord(addr))), futexWaitOp,
		uintptr(uint32(val)), uintptr(unsafe.Pointer(&ts)), 0, 0)
	switch e {
	case 0, syscall.EAGAIN, syscall.ETIMEDOUT, syscall.EINTR:
		return nil
	}
	return fmt.Errorf("futex wait: %w", e)
}

// futexWake wakes every thread blocked in futexWait on addr's word.
func futexWake(addr *uint64) {
	const all = 1<<31 - 1
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(futexWord(addr))), futexWakeOp, all, 0, 0, 0)
}

// osYield gives up the CPU to other runnable threads (sched_yield(2)).
func osYield() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

// futexWord returns the 32-bit half of a 64-bit word that holds its low
// bits: the futex compares 32 bits, and the low half is the one that
// changes on every arrival.
func futexWord(addr *uint64) *uint32 {
	if bigEndian {
		return (*uint32)(unsafe.Add(unsafe.Pointer(addr), 4))
	}
	return (*uint32)(unsafe.Pointer(addr))
}

var bigEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 0
}()
