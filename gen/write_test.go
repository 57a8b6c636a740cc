package gen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDiffCountsDirsAsGenerateDoes: an empty directory, or one holding no
// produced file, is an extra problem for Diff (check), as generate refuses
// it; check passed a tree generate would not rewrite.
func TestDiffCountsDirsAsGenerateDoes(t *testing.T) {
	dir := t.TempDir()
	out := &Output{Files: map[string][]byte{"MANIFEST": []byte("m\n"), "cuda/a.cu": []byte("a")}}
	if err := Write(dir, out); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "emptydir"), 0o755)
	os.MkdirAll(filepath.Join(dir, "cuda", "notes"), 0o755)
	problems, err := Diff(dir, out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.Kind+" "+p.Path)
	}
	if strings.Join(got, ", ") != "extra cuda/notes/, extra emptydir/" {
		t.Errorf("problems: %v; want the two directories as extra", got)
	}
}

// TestWriteRemovesOldLeftovers: the sibling directories an interrupted
// Write left are reported by Leftovers and removed by the next Write once
// older than a minute; a fresh one (a concurrent Write's) and names that
// are not os.MkdirTemp's stay.
func TestWriteRemovesOldLeftovers(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "gen")
	old := []string{".gen.new-123", ".gen.new-456.old"}
	keep := []string{".gen.new-789", ".gen.new-abc", ".other.new-1"}
	for _, n := range append(append([]string{}, old...), keep...) {
		os.MkdirAll(filepath.Join(parent, n, "cuda"), 0o755)
	}
	past := time.Now().Add(-time.Hour)
	for _, n := range old {
		os.Chtimes(filepath.Join(parent, n), past, past)
	}
	if got := len(Leftovers(dir)); got != 3 {
		t.Errorf("Leftovers: %d; want the three of os.MkdirTemp's form", got)
	}
	if err := Write(dir, &Output{Files: map[string][]byte{"MANIFEST": []byte("m\n")}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range old {
		if _, err := os.Stat(filepath.Join(parent, n)); err == nil {
			t.Errorf("%s survived", n)
		}
	}
	for _, n := range keep {
		if _, err := os.Stat(filepath.Join(parent, n)); err != nil {
			t.Errorf("%s was removed: %v", n, err)
		}
	}
}

// TestDiffExtraListedByManifest: a file an earlier generate wrote (its
// MANIFEST lists it) that the spec no longer produces, as after dropping a
// dtype or a world size, is removed by the next generate; check said
// generate refuses to run while it is there and told the user to remove
// it by hand. A file the MANIFEST does not list is still one generate
// refuses.
func TestDiffExtraListedByManifest(t *testing.T) {
	mod := t.TempDir()
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module example.com/m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(mod, "gen")
	both := render(t, "testdata/minimal/spec.yaml", dir, Options{})
	if err := Write(dir, both); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "cuda", "notes.txt"), []byte("mine"), 0o644)
	// The spec under another package name: the old package's directory is
	// no longer produced, but the MANIFEST lists every file in it.
	renamed := render(t, "testdata/minimal/spec.yaml", dir, Options{Package: "other"})
	problems, err := Diff(dir, renamed)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range problems {
		if p.Kind == "extra" {
			got[p.Path] = p.String()
		}
	}
	if msg := got["mini/"]; !strings.Contains(msg, "collgen generate removes it") || strings.Contains(msg, "refuses") {
		t.Errorf("mini/ (listed in the MANIFEST): %q; want generate to remove it", msg)
	}
	if msg := got["cuda/notes.txt"]; !strings.Contains(msg, "refuses") {
		t.Errorf("cuda/notes.txt (not listed): %q; want generate to refuse it", msg)
	}
}
