package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the launcher's writers and the
// test's reads at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A signal that arrives just as the ranks start running is forwarded
// once: the ranks get SIGTERM and --grace to stop. It was forwarded twice
// when it landed between the group's publication and run's check for a
// signal that cancelled the start (the handler, then the main goroutine),
// and a second forward is SIGKILL at once: the ranks had no grace at all.
func TestRunSignalAtStartForwardedOnce(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	var stdout, stderr lockedBuffer
	runStarted = func() {
		// The rank has set its trap; the signal arrives now and the
		// handler has forwarded it before run goes on.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(ready); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Error("the rank did not start")
				return
			}
		}
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), "stopping all ranks"); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("the launcher did not see the signal")
				return
			}
		}
		time.Sleep(200 * time.Millisecond) // the handler forwards right after it says so
	}
	defer func() { runStarted = nil }()
	script := `trap 'sleep 1; echo got-term; exit 3' TERM; touch "$1"; while :; do sleep 0.02; done`
	code := Do([]string{"run", "-n", "1", "--grace", "20s", "--", "/bin/sh", "-c", script, "sh", ready}, nil, &stdout, &stderr)
	if want := 128 + int(syscall.SIGTERM); code != want {
		t.Errorf("exit code %d, want %d", code, want)
	}
	if !strings.Contains(stdout.String(), "[rank 0] got-term") {
		t.Errorf("the rank did not get SIGTERM and its grace (killed at once?); stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}
