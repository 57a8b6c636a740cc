//go:build !linux

package launch

import "syscall"

// setDeathSignal does nothing: only Linux has a parent-death signal.
func setDeathSignal(a *syscall.SysProcAttr) {}

// sweepShm does nothing: collgen's shared-memory segments are Linux only.
func sweepShm(dir, runID string) ([]string, error) { return nil, nil }
