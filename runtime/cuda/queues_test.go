package cuda

import (
	"os"
	"path/filepath"
	"syscall"
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
	t.Setenv(EnvMPSPipeDirectory, t.TempDir()) // no MPS daemon there
	t.Setenv(EnvMaxConnections, "")            // restores the original after the test
	os.Unsetenv(EnvMaxConnections)
	if got, _ := askWorkQueues(); got != MaxWorkQueues || os.Getenv(EnvMaxConnections) != "32" {
		t.Fatalf("unset: askWorkQueues() = %d with %s=%q; want 32 and the variable set to 32", got, EnvMaxConnections, os.Getenv(EnvMaxConnections))
	}
	for v, want := range map[string]int{"4": 4, "1": 1, "64": 8} {
		os.Setenv(EnvMaxConnections, v)
		if got, _ := askWorkQueues(); got != want || os.Getenv(EnvMaxConnections) != v {
			t.Errorf("set to %q: askWorkQueues() = %d, variable %q; want %d, the variable kept", v, got, os.Getenv(EnvMaxConnections), want)
		}
	}
}

// TestAskWorkQueuesUnderMPS (reliability case 36): where an MPS control
// daemon's pipe is (a named pipe or socket "control" in
// CUDA_MPS_PIPE_DIRECTORY), the variable is left unset and contexts get
// CUDA's default 8: MPS clients share one pool of queues, and at 32 each
// a fourth process could not create a context on an H100. A plain file
// named control, or an empty directory, is no daemon.
func TestAskWorkQueuesUnderMPS(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvMPSPipeDirectory, dir)
	t.Setenv(EnvMaxConnections, "")
	os.Unsetenv(EnvMaxConnections)
	control := filepath.Join(dir, "control")
	if err := os.WriteFile(control, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if mpsPipe() != "" {
		t.Fatal("a regular file named control counts as the MPS daemon's pipe")
	}
	os.Remove(control)
	if err := syscall.Mkfifo(control, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	if got := mpsPipe(); got != control {
		t.Fatalf("mpsPipe() = %q with a named pipe at %s", got, control)
	}
	if got, _ := askWorkQueues(); got != defaultWorkQueues {
		t.Errorf("under MPS: askWorkQueues() = %d, want CUDA's default %d", got, defaultWorkQueues)
	}
	if v, set := os.LookupEnv(EnvMaxConnections); set {
		t.Errorf("under MPS the variable was set to %q", v)
	}
	os.Setenv(EnvMaxConnections, "32") // a value the user chose is kept, MPS or not
	if got, _ := askWorkQueues(); got != 32 {
		t.Errorf("under MPS with the variable at 32: %d", got)
	}
}
