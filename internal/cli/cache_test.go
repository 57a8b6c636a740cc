package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCacheCommand: `collgen cache` reports the directory's entries;
// --prune AGE removes those unused for AGE with their lock files; --clear
// removes the rest; bad ages and both flags are usage errors (exit 2).
func TestCacheCommand(t *testing.T) {
	dir := t.TempDir()
	old, recent := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	month := time.Now().Add(-30 * 24 * time.Hour)
	for _, name := range []string{old + ".cgbin", old + ".lock", recent + ".cgbin", recent + ".lock", "README"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Chtimes(filepath.Join(dir, old+".cgbin"), month, month)
	run := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		code := Do(append([]string{"cache", "--dir", dir}, args...), nil, &out, &errOut)
		return out.String() + errOut.String(), code
	}
	if out, code := run(); code != 0 || !strings.Contains(out, dir+": 2 entries, 2 B, last used ") || !strings.Contains(out, "; 2 lock files, 0 temporary files") {
		t.Fatalf("report (exit %d):\n%s", code, out)
	}
	if out, code := run("--prune", "7d"); code != 0 || !strings.Contains(out, "removed entries unused for 7d: 1 entries (0.0 MiB), 1 lock files") || !strings.Contains(out, ": 1 entries") {
		t.Fatalf("prune (exit %d):\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, recent+".cgbin")); err != nil {
		t.Fatalf("the recent entry went: %v", err)
	}
	if out, code := run("--clear"); code != 0 || !strings.Contains(out, "removed every entry: 1 entries") || !strings.Contains(out, ": 0 entries, 0 B; 0 lock files") {
		t.Fatalf("clear (exit %d):\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "README")); err != nil {
		t.Fatalf("a file that is not the cache's went: %v", err)
	}
	for _, args := range [][]string{{"--prune", "3x"}, {"--prune", "-1h"}, {"--prune", "1d", "--clear"}} {
		if out, code := run(args...); code != 2 || !strings.Contains(out, "cache: --") {
			t.Errorf("%v: exit %d:\n%s", args, code, out)
		}
	}
}
