//go:build !linux

package launch

import "syscall"

// setDeathSignal does nothing: only Linux has a parent-death signal.
func setDeathSignal(a *syscall.SysProcAttr) {}

// sweepShm does nothing: collgen's shared-memory segments are Linux only.
func sweepShm(dir, runID string) ([]string, error) { return nil, nil }

// claimRun records nothing: there are no segments to sweep.
func claimRun(dir, runID string) (func() error, error) { return func() error { return nil }, nil }

// sweepDeadRuns sweeps nothing.
func sweepDeadRuns(dir string) (runs, removed []string, err error) { return nil, nil, nil }
