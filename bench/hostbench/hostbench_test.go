package hostbench

import (
	"errors"
	"testing"
	"time"
)

// TestWarmUp: a cold first round that alone outlasts the warm-up does not
// size the run (it did, giving 2-16 MiB sweeps 7-35 iterations); the next
// round does. Rounds double; errors end the warm-up.
func TestWarmUp(t *testing.T) {
	var ns []int
	elapsed := 0.0
	per, err := warmUp(20*time.Millisecond, func(n int) (float64, float64, error) {
		ns = append(ns, n)
		if len(ns) == 1 {
			elapsed += 0.036
			return 0.012, elapsed, nil // page faults
		}
		elapsed += float64(n) * 0.001
		return 0.001, elapsed, nil
	})
	if err != nil || per != 0.001 || len(ns) != 2 || ns[0] != 3 || ns[1] != 6 {
		t.Errorf("warmUp = %v, %v after rounds %v; want 0.001 s from the second round of 6", per, err, ns)
	}
	ns = nil
	elapsed = 0
	per, _ = warmUp(50*time.Millisecond, func(n int) (float64, float64, error) {
		ns = append(ns, n)
		elapsed += float64(n) * 0.002
		return 0.002, elapsed, nil
	})
	if per != 0.002 || len(ns) != 4 { // 6, 18, 42, 90 ms elapsed
		t.Errorf("fast rounds: %v after %v; want 4 rounds", per, ns)
	}
	boom := errors.New("boom")
	if _, err := warmUp(time.Second, func(int) (float64, float64, error) { return 0, 0, boom }); !errors.Is(err, boom) {
		t.Errorf("error: %v", err)
	}
}
