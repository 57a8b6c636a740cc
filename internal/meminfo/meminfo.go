// Package meminfo says how much memory this process can still take, so
// that a request beyond it is refused with an error instead of waking the
// kernel's OOM killer (memory of a memfd, unlike /dev/shm, has no size
// limit of its own).
package meminfo

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Available returns the bytes of memory this process can still take: the
// least of /proc/meminfo's MemAvailable and its memory cgroup's limit less
// its usage (cgroup v2's memory.max and memory.current, or v1's
// memory.limit_in_bytes and memory.usage_in_bytes). ok is false when none
// of them can be read. It is a snapshot: others may take memory next.
func Available() (bytes int64, ok bool) { return available("/") }

// available is Available with the file system rooted at root (tests).
func available(root string) (int64, bool) {
	best, ok := int64(0), false
	take := func(v int64) {
		if !ok || v < best {
			best, ok = v, true
		}
	}
	if v, found := memAvailable(filepath.Join(root, "proc/meminfo")); found {
		take(v)
	}
	if v, found := cgroupHeadroom(root); found {
		take(v)
	}
	return max(best, 0), ok
}

// memAvailable reads MemAvailable (kB) from a meminfo file.
func memAvailable(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, found := strings.CutPrefix(line, "MemAvailable:"); found {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, false
			}
			return kb << 10, true
		}
	}
	return 0, false
}

// cgroupHeadroom returns the memory cgroup's limit less its usage: the
// process's own cgroup (from /proc/self/cgroup) under /sys/fs/cgroup, or
// the mount's root where a container shows only its own cgroup there.
// false when the cgroup has no limit or none can be read.
func cgroupHeadroom(root string) (int64, bool) {
	v2, v1 := cgroupPaths(filepath.Join(root, "proc/self/cgroup"))
	sys := filepath.Join(root, "sys/fs/cgroup")
	type files struct{ limit, usage string }
	var cands []files
	for _, dir := range []string{filepath.Join(sys, v2), sys} {
		cands = append(cands, files{filepath.Join(dir, "memory.max"), filepath.Join(dir, "memory.current")})
	}
	for _, dir := range []string{filepath.Join(sys, "memory", v1), filepath.Join(sys, "memory")} {
		cands = append(cands, files{filepath.Join(dir, "memory.limit_in_bytes"), filepath.Join(dir, "memory.usage_in_bytes")})
	}
	for _, f := range cands {
		limit, lok := readInt(f.limit)
		usage, uok := readInt(f.usage)
		if !lok || !uok {
			continue
		}
		if limit >= 1<<62 { // "max" (v2) or v1's page-rounded MaxInt64: no limit
			return 0, false
		}
		return limit - usage, true
	}
	return 0, false
}

// cgroupPaths returns the process's cgroup v2 path ("0::<path>") and its
// v1 memory controller's path ("<n>:memory:<path>"), each "" when absent.
func cgroupPaths(path string) (v2, v1 string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case hasController(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	return v2, v1
}

// hasController reports whether a comma-separated controller list names c.
func hasController(list, c string) bool {
	for x := range strings.SplitSeq(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// readInt reads a file holding one integer; "max" is MaxInt64.
func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 1<<63 - 1, true
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}
