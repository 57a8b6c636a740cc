package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A malformed --only glob is a usage error (exit 2, as README.md says of
// a bad flag value) in every command that takes one, as fatbin's already
// is; it used to exit 1 from generate, check and list.
func TestOnlyBadPatternIsUsage(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "collgen.yaml")
	if err := os.WriteFile(spec, StarterSpec("collectives"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/m\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "gen")
	for _, args := range [][]string{
		{"generate", "--spec", spec, "--out", out, "--only", "["},
		{"check", "--spec", spec, "--out", out, "--only", "["},
		{"list", "--spec", spec, "--only", "["},
		{"fatbin", "--dir", out, "--only", "["},
	} {
		var stdout, stderr bytes.Buffer
		if code := Do(args, nil, &stdout, &stderr); code != 2 {
			t.Errorf("collgen %s: exit %d, want 2 (a usage error); stderr: %s", strings.Join(args, " "), code, stderr.String())
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s exists after refused commands: %v", out, err)
	}
}

// bench --csv - and --png - neither drop the results silently nor write a
// file named "-": "-" means standard output for --json only, and the
// others refuse it before the sweep, as a usage error.
func TestBenchDashOutputs(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, flag := range []string{"--csv", "--png"} {
		var stdout, stderr bytes.Buffer
		code := Do([]string{"bench", "--backend", "host", "--goroutines", "-n", "2", "--sizes", "4KiB", "--iters", "1", flag, "-"}, nil, &stdout, &stderr)
		if code != 2 {
			t.Errorf("bench %s -: exit %d, want 2 (usage); stdout:\n%sstderr:\n%s", flag, code, stdout.String(), stderr.String())
		}
		if _, err := os.Stat("-"); err == nil {
			t.Errorf("bench %s - wrote a file named -", flag)
			os.Remove("-")
		}
	}
}
