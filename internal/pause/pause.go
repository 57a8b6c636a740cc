// Package pause sleeps for short times as asked. Go's time.Sleep lasts at
// least about a millisecond for any shorter duration when the runtime has
// nothing else to run (it waits in epoll, whose timeout is in whole
// milliseconds): 20 µs sleeps took 0.97-1.11 ms each on the development VM,
// and a wait that polled NCCL with 200 µs sleeps made every eager
// non-blocking NCCL call take 1.1 ms on 2 x H200. Polling loops whose
// sleeps must stay short (a collective that ends within microseconds of
// the first sleep) use For instead.
package pause

import "time"

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
