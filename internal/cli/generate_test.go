package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gen2 "github.com/collgen/collgen/gen"
)

// TestCheckOutDirTyped: what generate refuses comes back as a
// *ForeignDirError naming the directory and the entries that show it is
// not collgen's, and the directory is left untouched.
func TestCheckOutDirTyped(t *testing.T) {
	repo := t.TempDir()
	os.Mkdir(filepath.Join(repo, ".git"), 0o755)
	os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n"), 0o644)
	err := checkOutDir(repo, &gen2.Output{})
	var fe *ForeignDirError
	if !errors.As(err, &fe) || fe.Dir != repo || strings.Join(fe.Entries, ",") != ".git,main.go" {
		t.Fatalf("checkOutDir = %#v (%v), want a ForeignDirError naming .git and main.go", err, err)
	}
	if _, err := os.Stat(filepath.Join(repo, "main.go")); err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{filepath.Join(repo, "missing"), t.TempDir()} {
		if err := checkOutDir(ok, &gen2.Output{}); err != nil {
			t.Errorf("checkOutDir(%s) = %v, want nil", ok, err)
		}
	}
	gen := t.TempDir()
	os.WriteFile(filepath.Join(gen, "MANIFEST"), []byte(gen2.ManifestHeader+"\nfile 00 cuda/a.cu\nfile 00 pkg/k.go\n"), 0o644)
	os.Mkdir(filepath.Join(gen, "cuda"), 0o755)
	os.Mkdir(filepath.Join(gen, "pkg"), 0o755)
	if err := checkOutDir(gen, &gen2.Output{}); err != nil {
		t.Fatalf("a collgen tree: %v", err)
	}
	os.WriteFile(filepath.Join(gen, "notes.txt"), nil, 0o644)
	if err := checkOutDir(gen, &gen2.Output{}); !errors.As(err, &fe) || strings.Join(fe.Entries, ",") != "notes.txt" {
		t.Fatalf("a collgen tree with a foreign file: %v", err)
	}
}
