//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// runRecordPrefix names a launcher's run record in the segment directory:
// "collgen.run-<run id>", a file of the launcher's uid, mode 0600, holding
// "<pid namespace inode> <pid>\n". Records live beside the segments, so
// every launcher that shares a /dev/shm sees them. (shm.Prefix is
// "collgen-": no sweep of segments ever matches a record.)
const runRecordPrefix = "collgen.run-"

// ClaimRun records in dir (DefaultDir when empty) that this process
// launches run runID, so that if it is killed before it can sweep the
// run's segments (SweepRun), the next launcher does (SweepDeadRuns).
// Release, once the run's segments are swept, removes the record.
func ClaimRun(dir, runID string) (release func() error, err error) {
	if err := CheckRunID(runID); err != nil {
		return nil, err
	}
	if dir == "" {
		dir = DefaultDir
	}
	path := filepath.Join(dir, runRecordPrefix+runID)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shm: record run %s: %w", runID, err)
	}
	_, werr := fmt.Fprintf(f, "%d %d\n", PIDNamespace(), os.Getpid())
	if err := errors.Join(werr, f.Close()); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("shm: record run %s: %w", runID, err)
	}
	return func() error {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("shm: remove run record: %w", err)
		}
		return nil
	}, nil
}

// SweepDeadRuns finds the run records in dir (DefaultDir when empty) of
// launchers that are gone: records this user owns whose launcher ran in
// this process's pid namespace and whose pid no longer runs. For each it
// removes the run's segments (SweepRun) and then the record, and returns
// the runs and the segment names removed. A record from another pid
// namespace, another user, or malformed is left alone: its launcher's
// liveness cannot be known (a reused pid reads as alive, which only
// delays the sweep).
func SweepDeadRuns(dir string) (runs, removed []string, err error) {
	if dir == "" {
		dir = DefaultDir
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("shm: sweep dead runs: %w", err)
	}
	ns := PIDNamespace()
	var errs []error
	for _, e := range ents {
		runID, ok := strings.CutPrefix(e.Name(), runRecordPrefix)
		if !ok || CheckRunID(runID) != nil {
			continue
		}
		path := filepath.Join(dir, e.Name())
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil || !ownedBySelf(&st) {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var recNS uint64
		var pid int
		if n, _ := fmt.Sscanf(string(b), "%d %d", &recNS, &pid); n != 2 || !deadProcess(ns, recNS, pid) {
			continue
		}
		gone, err := SweepRun(dir, runID)
		removed = append(removed, gone...)
		if err != nil {
			errs = append(errs, err)
			continue // keep the record: the next launcher tries again
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		runs = append(runs, runID)
	}
	return runs, removed, errors.Join(errs...)
}

// DeadProcess reports whether the process pid, recorded with pid
// namespace ns (its PIDNamespace), has ended. A process of another
// namespace, or of an unknown one, is never taken for dead: this process
// cannot look it up (a reused pid reads as alive, which only delays a
// sweep).
func DeadProcess(ns uint64, pid int) bool { return deadProcess(PIDNamespace(), ns, pid) }

// deadProcess is DeadProcess with this process's namespace as own.
func deadProcess(own, ns uint64, pid int) bool {
	return own != 0 && ns == own && pid > 0 && syscall.Kill(pid, 0) == syscall.ESRCH
}

// PIDNamespace returns the inode of this process's pid namespace (what
// /proc/self/ns/pid links to), or 0 where it cannot be read. Two processes
// with the same one see each other's pids.
func PIDNamespace() uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}
