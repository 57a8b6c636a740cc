package pause

import (
	"testing"
	"time"
)

// TestBackoffBounds: the zero value sleeps 10 µs until longWait (it never
// spins forever); a loop exactly longWait old is not yet a long wait; a
// Max above a millisecond stays the cap past longWait.
func TestBackoffBounds(t *testing.T) {
	us := time.Microsecond
	var zero Backoff
	for _, age := range []time.Duration{0, time.Millisecond, longWait} {
		if got := zero.next(age); got != 10*us {
			t.Errorf("zero Backoff at age %v: pause %v, want 10µs", age, got)
		}
	}
	b := Backoff{Max: 100 * us}
	for range 10 {
		b.next(time.Millisecond)
	}
	if got := b.next(longWait); got != 100*us {
		t.Errorf("at age longWait exactly: pause %v, want Max 100µs (a long wait is older)", got)
	}
	if got := b.next(longWait + 1); got != 200*us {
		t.Errorf("just past longWait: pause %v, want 200µs", got)
	}
	long := Backoff{Max: 5 * time.Millisecond}
	var got time.Duration
	for range 20 {
		got = long.next(time.Second)
	}
	if got != 5*time.Millisecond {
		t.Errorf("Max 5ms, past longWait: pause %v, want Max", got)
	}
}
