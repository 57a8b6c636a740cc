//go:build cgo

package cuda

import (
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestMPSHint (reliability case 36): a context that cannot be created for
// want of the MPS server's resources says why, and stays the driver's
// error for errors.Is; other errors, or no MPS daemon, are left as they
// are.
func TestMPSHint(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvMPSPipeDirectory, dir)
	t.Setenv(EnvMaxConnections, "32")
	oom := &Error{Op: "cuDevicePrimaryCtxRetain", Device: 0, Code: ErrorOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	if err := mpsHint(oom); err != error(oom) {
		t.Errorf("without an MPS daemon: %v", err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "control"), 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	err := mpsHint(oom)
	if !errors.Is(err, ErrorOutOfMemory) || !strings.Contains(err.Error(), "client of the MPS daemon") || !strings.Contains(err.Error(), EnvMaxConnections+"=32 each") {
		t.Errorf("under MPS: %v", err)
	}
	maxConn := &Error{Op: "cuDevicePrimaryCtxRetain", Device: 0, Code: 805, Name: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"}
	if err := mpsHint(maxConn); !strings.Contains(err.Error(), "one pool of hardware work queues") {
		t.Errorf("MPS connections: %v", err)
	}
	other := &Error{Op: "cuDevicePrimaryCtxRetain", Device: 0, Code: ErrorInvalidDevice, Name: "CUDA_ERROR_INVALID_DEVICE"}
	if err := mpsHint(other); err != error(other) {
		t.Errorf("another error under MPS: %v", err)
	}
}
