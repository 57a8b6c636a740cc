package pause

import (
	"runtime"
	"testing"
	"time"
)

// TestShortSleepsStayShort: 100 sleeps of 20 µs take well under the 100
// ms that time.Sleep's millisecond floor makes of them. The bound is loose
// (a loaded 2-core CI machine) but fails with time.Sleep in short.
func TestShortSleepsStayShort(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("nanosleep is wired up on Linux only")
	}
	best := time.Hour
	for range 3 { // the best of three rounds, against a busy machine
		start := time.Now()
		for range 100 {
			For(20 * time.Microsecond)
		}
		best = min(best, time.Since(start))
	}
	if best > 60*time.Millisecond {
		t.Fatalf("100 sleeps of 20µs took %v; want well under 100ms (time.Sleep's floor)", best)
	}
	t.Logf("100 sleeps of 20µs: %v", best)
}

// TestSleepsAtLeast: For sleeps at least what it is asked.
func TestSleepsAtLeast(t *testing.T) {
	for _, d := range []time.Duration{50 * time.Microsecond, 2 * time.Millisecond} {
		start := time.Now()
		For(d)
		if got := time.Since(start); got < d {
			t.Errorf("For(%v) returned after %v", d, got)
		}
	}
	start := time.Now()
	For(-time.Second)
	For(0)
	if got := time.Since(start); got > 50*time.Millisecond {
		t.Errorf("For of 0 and a negative duration took %v", got)
	}
}

// TestBackoffSteps: no sleep within Spin, then 10 µs doubling up to Max,
// then up to a millisecond once the loop is older than longWait.
func TestBackoffSteps(t *testing.T) {
	b := Backoff{Spin: 50 * time.Microsecond, Max: 100 * time.Microsecond}
	us := time.Microsecond
	steps := []struct {
		age, want time.Duration
	}{
		{0, 0}, {49 * us, 0},
		{50 * us, 10 * us}, {60 * us, 20 * us}, {80 * us, 40 * us}, {120 * us, 80 * us},
		{200 * us, 100 * us}, {5 * time.Millisecond, 100 * us},
		{11 * time.Millisecond, 200 * us}, {12 * time.Millisecond, 400 * us},
		{13 * time.Millisecond, 800 * us}, {14 * time.Millisecond, time.Millisecond}, {time.Second, time.Millisecond},
	}
	for _, s := range steps {
		if got := b.next(s.age); got != s.want {
			t.Fatalf("at age %v: pause %v, want %v", s.age, got, s.want)
		}
	}
}
