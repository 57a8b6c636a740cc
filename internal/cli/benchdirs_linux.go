package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/collgen/collgen/runtime/shm"
)

// benchDirPrefix starts the name of the directory of a bench's rank
// processes (their file store and results): collgen-bench-<pid namespace>-
// <pid>-, so a later bench can tell a directory whose bench was killed.
func benchDirPrefix() string {
	return fmt.Sprintf("collgen-bench-%d-%d-", shm.PIDNamespace(), os.Getpid())
}

// sweepBenchDirs removes the directories in dir (os.TempDir when empty)
// that a bench of this pid namespace and this user left when it was killed
// (SIGKILL skips its own removal): their pid is gone. Best effort.
func sweepBenchDirs(dir string) {
	if dir == "" {
		dir = os.TempDir()
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "collgen-bench-")
		if !ok || !e.IsDir() {
			continue
		}
		f := strings.SplitN(rest, "-", 3)
		if len(f) != 3 {
			continue
		}
		ns, err1 := strconv.ParseUint(f[0], 10, 64)
		pid, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil || !shm.DeadProcess(ns, pid) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		var st syscall.Stat_t
		if syscall.Lstat(path, &st) != nil || int(st.Uid) != os.Geteuid() {
			continue
		}
		os.RemoveAll(path)
	}
}
