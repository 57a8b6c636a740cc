//go:build !linux

package host

import (
	"runtime"
	"time"
)

// pollPause is how long a blocked waiter sleeps between looks at the word
// where there is no futex: the wait costs a wake-up per pause instead of
// none, and the peer's arrival is seen up to a pause late.
const pollPause = 50 * time.Microsecond

// futexWait is the fallback for systems without Linux futexes: it sleeps
// for at most pollPause (or d, if shorter) and lets the caller re-read the
// word, so waits stay correct, only slower to notice an arrival.
func futexWait(addr *uint64, val uint64, d time.Duration) error {
	time.Sleep(min(d, pollPause))
	return nil
}

// futexWake has nothing to wake: blocked waiters poll.
func futexWake(addr *uint64) {}

// osYield gives up the processor to other goroutines (the portable part of
// the Linux version's sched_yield).
func osYield() { runtime.Gosched() }
