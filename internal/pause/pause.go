// Package pause sleeps for short times as asked. Go's time.Sleep lasts at
// least about a millisecond for any shorter duration when the runtime has
// nothing else to run (it waits in epoll, whose timeout is in whole
// milliseconds): 20 µs sleeps took 0.97-1.11 ms each on the development VM,
// and a wait that polled NCCL with 200 µs sleeps made every eager
// non-blocking NCCL call take 1.1 ms on 2 x H200. Polling loops whose
// sleeps must stay short (a collective that ends within microseconds of
// the first sleep) use For instead.
package pause

import (
	"runtime"
	"time"
)

// For sleeps for about d: below a millisecond it blocks the calling thread
// in the kernel (nanosleep on Linux), which wakes within the kernel's
// timer slack (tens of microseconds); from a millisecond on it is
// time.Sleep. d <= 0 returns at once.
func For(d time.Duration) {
	if d <= 0 {
		return
	}
	if d >= time.Millisecond {
		time.Sleep(d)
		return
	}
	short(d)
}

// Backoff paces a polling loop: Wait yields the processor (no sleep) for
// the first Spin of the loop (a wait that ends within microseconds costs
// none), then sleeps, doubling from 10 µs up to Max, and up to a
// millisecond once the loop has lasted 10 ms (a long wait then costs a
// wake-up a millisecond). The zero value spins for nothing and sleeps up
// to 10 µs. Not safe for concurrent use: one per loop.
type Backoff struct {
	// Spin is how long the loop yields before it first sleeps; Max caps
	// the doubling sleep (at least 10 µs, and at least a millisecond once
	// the loop is 10 ms old).
	Spin, Max time.Duration
	start     time.Time
	sleep     time.Duration
}

// Long-wait pacing of Backoff.
const (
	longWait  = 10 * time.Millisecond
	longSleep = time.Millisecond
)

// Wait yields or sleeps once, as the loop's age asks.
func (b *Backoff) Wait() {
	now := time.Now()
	if b.start.IsZero() {
		b.start = now
	}
	if d := b.next(now.Sub(b.start)); d > 0 {
		For(d)
	} else {
		runtime.Gosched()
	}
}

// next is the pause after a loop age of age: 0 (yield) within Spin, else
// the previous sleep doubled, from 10 µs, within Max (a millisecond past
// longWait).
func (b *Backoff) next(age time.Duration) time.Duration {
	if age < b.Spin {
		return 0
	}
	most := max(b.Max, 10*time.Microsecond)
	if age > longWait {
		most = max(most, longSleep)
	}
	b.sleep = min(max(2*b.sleep, 10*time.Microsecond), most)
	return b.sleep
}
