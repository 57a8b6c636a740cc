package cuda

import (
	"os"
	"testing"
)

// TestWorkQueuesFrom: CUDA_DEVICE_MAX_CONNECTIONS counts when it is a
// number from 1 to 32; anything else is CUDA's default of 8.
func TestWorkQueuesFrom(t *testing.T) {
	for _, c := range []struct {
		v    string
		set  bool
		want int
	}{
		{"", false, 8}, {"32", true, 32}, {"1", true, 1}, {"16", true, 16},
		{"0", true, 8}, {"33", true, 8}, {"-4", true, 8}, {"many", true, 8}, {"", true, 8}, {"32", false, 8},
	} {
		if got := workQueuesFrom(c.v, c.set); got != c.want {
			t.Errorf("workQueuesFrom(%q, %v) = %d, want %d", c.v, c.set, got, c.want)
		}
	}
}

// TestAskWorkQueues: unset, the variable is set to the maximum (32); a
// value the process set is kept, and counted as CUDA counts it.
func TestAskWorkQueues(t *testing.T) {
	t.Setenv(EnvMaxConnections, "") // restores the original after the test
	os.Unsetenv(EnvMaxConnections)
	if got := askWorkQueues(); got != MaxWorkQueues || os.Getenv(EnvMaxConnections) != "32" {
		t.Fatalf("unset: askWorkQueues() = %d with %s=%q; want 32 and the variable set to 32", got, EnvMaxConnections, os.Getenv(EnvMaxConnections))
	}
	for v, want := range map[string]int{"4": 4, "1": 1, "64": 8} {
		os.Setenv(EnvMaxConnections, v)
		if got := askWorkQueues(); got != want || os.Getenv(EnvMaxConnections) != v {
			t.Errorf("set to %q: askWorkQueues() = %d, variable %q; want %d, the variable kept", v, got, os.Getenv(EnvMaxConnections), want)
		}
	}
}
