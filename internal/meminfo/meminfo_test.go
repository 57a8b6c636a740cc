package meminfo

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeRoot writes files (path relative to the root: content) under a
// temporary root.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const meminfo = "MemTotal:       32000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n"

func TestAvailable(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		want  int64
		ok    bool
	}{
		{"meminfo only", map[string]string{"proc/meminfo": meminfo}, 20000000 << 10, true},
		{"nothing readable", map[string]string{}, 0, false},
		{"v2 limit below MemAvailable", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "0::/job/rank0\n",
			"sys/fs/cgroup/job/rank0/memory.max": "8589934592\n", "sys/fs/cgroup/job/rank0/memory.current": "1073741824\n",
		}, 7 << 30, true},
		{"v2 unlimited", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "0::/\n",
			"sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": "5\n",
		}, 20000000 << 10, true},
		{"v2 in a container: the mount's root", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "0::/kubepods/pod1\n",
			"sys/fs/cgroup/memory.max": "4294967296", "sys/fs/cgroup/memory.current": "1073741824",
		}, 3 << 30, true},
		{"v1 memory controller", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "5:cpu,cpuacct:/\n4:memory:/job\n",
			"sys/fs/cgroup/memory/job/memory.limit_in_bytes": "2147483648", "sys/fs/cgroup/memory/job/memory.usage_in_bytes": "1073741824",
		}, 1 << 30, true},
		{"v1 unlimited", map[string]string{
			"proc/meminfo": meminfo, "proc/self/cgroup": "4:memory:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712", "sys/fs/cgroup/memory/memory.usage_in_bytes": "859435008",
		}, 20000000 << 10, true},
		{"over the limit", map[string]string{
			"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "100", "sys/fs/cgroup/memory.current": "200",
		}, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := available(fakeRoot(t, c.files))
			if got != c.want || ok != c.ok {
				t.Errorf("available = %d, %v; want %d, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

// TestAvailableHere: on this machine the answer is positive and no more
// than the machine's memory (MemTotal: a second reading of MemAvailable
// moves with whatever else runs, and was once 4 MB below the first).
func TestAvailableHere(t *testing.T) {
	got, ok := Available()
	if !ok || got <= 0 {
		t.Fatalf("Available = %d, %v on a Linux machine", got, ok)
	}
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(string(data), "\n") {
		if rest, found := strings.CutPrefix(line, "MemTotal:"); found {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("MemTotal line %q: %v", line, err)
			}
			total = kb << 10
		}
	}
	if total <= 0 {
		t.Fatal("no MemTotal in /proc/meminfo")
	}
	if got > total {
		t.Errorf("Available %d is more than MemTotal %d", got, total)
	}
}
