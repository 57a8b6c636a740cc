package launch

import (
	"syscall"

	"github.com/collgen/collgen/runtime/shm"
)

// setDeathSignal asks the kernel to SIGKILL the rank when the launcher
// dies (prctl PR_SET_PDEATHSIG), so killing `collgen run` itself, even with
// SIGKILL, leaves no orphaned ranks. The signal follows the thread that
// forked the rank; Go only ends threads locked by goroutines that exit
// without unlocking, which the launcher never does.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// sweepShm removes the run's shared-memory segments (see shm.SweepRun).
func sweepShm(dir, runID string) ([]string, error) { return shm.SweepRun(dir, runID) }

// claimRun records this launcher's run beside the segments (shm.ClaimRun).
func claimRun(dir, runID string) (func() error, error) { return shm.ClaimRun(dir, runID) }

// sweepDeadRuns sweeps the runs of launchers that are gone
// (shm.SweepDeadRuns).
func sweepDeadRuns(dir string) (runs, removed []string, err error) { return shm.SweepDeadRuns(dir) }
