package gen

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/rogpeppe/go-internal/diff"
)

// Write replaces the tree at dir with out. The whole tree is first written
// into a fresh sibling directory, then swapped in with two renames, so a
// crash or error leaves either the old tree or the new one, never a mix;
// files that no longer belong (a kernel dropped from the spec) disappear
// with the old tree. collgen owns dir entirely: anything else in it is
// removed too (Diff reports such files as extra before you lose them).
func Write(dir string, out *Output) error {
	dir = filepath.Clean(dir)
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", dir, err)
	}
	removeLeftovers(dir, time.Minute)
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".new-")
	if err != nil {
		return fmt.Errorf("write %s: %w", dir, err)
	}
	cleanup := func() { os.RemoveAll(tmp) }
	for _, p := range out.Paths() {
		full := filepath.Join(tmp, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			cleanup()
			return fmt.Errorf("write %s: %w", dir, err)
		}
		if err := os.WriteFile(full, out.Files[p], 0o644); err != nil {
			cleanup()
			return fmt.Errorf("write %s: %w", dir, err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		cleanup()
		return fmt.Errorf("write %s: %w", dir, err)
	}
	old := ""
	if _, err := os.Stat(dir); err == nil {
		old = tmp + ".old"
		if err := os.Rename(dir, old); err != nil {
			cleanup()
			return fmt.Errorf("write %s: move old tree aside: %w", dir, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			os.Rename(old, dir) // put the old tree back
		}
		cleanup()
		return fmt.Errorf("write %s: %w", dir, err)
	}
	if old != "" {
		os.RemoveAll(old)
	}
	return nil
}

// Leftovers returns the sibling directories of dir that an interrupted
// Write left (".<base>.new-<n>", and its ".old"): the next Write removes
// those older than a minute (a younger one may be a concurrent Write's).
func Leftovers(dir string) []string {
	dir = filepath.Clean(dir)
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), "."+globEscape(filepath.Base(dir))+".new-*"))
	var out []string
	for _, p := range m {
		rest := strings.TrimPrefix(filepath.Base(p), "."+filepath.Base(dir)+".new-")
		rest = strings.TrimSuffix(rest, ".old")
		if rest == "" || strings.Trim(rest, "0123456789") != "" {
			continue // not os.MkdirTemp's digits: not ours
		}
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// removeLeftovers removes Leftovers(dir) older than age.
func removeLeftovers(dir string, age time.Duration) {
	for _, p := range Leftovers(dir) {
		if fi, err := os.Lstat(p); err == nil && time.Since(fi.ModTime()) > age {
			os.RemoveAll(p)
		}
	}
}

// globEscape escapes the glob metacharacters of a literal name.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Problem is one difference between a rendered tree and the disk.
type Problem struct {
	Path string // relative to the tree root, slash form
	Kind string // "stale" (content differs), "missing", "extra"
	Diff string // unified diff for stale files
	// Listed is set on an extra file, or directory, that the tree's
	// MANIFEST lists (or lists files under): an earlier generate wrote it,
	// and the next one removes it. generate refuses to replace a tree
	// holding extra entries that are not listed.
	Listed bool
}

// String describes the problem as check prints it.
func (p Problem) String() string {
	switch p.Kind {
	case "missing":
		return fmt.Sprintf("%s: missing (collgen generate would create it)", p.Path)
	case "extra":
		if p.Listed {
			return fmt.Sprintf("%s: extra (no longer produced by the spec; collgen generate removes it)", p.Path)
		}
		return fmt.Sprintf("%s: extra (not produced by the spec; collgen generate refuses to run while it is there: remove it)", p.Path)
	}
	return fmt.Sprintf("%s: stale or hand-edited\n%s", p.Path, p.Diff)
}

// Diff compares out with the tree at dir and returns every difference,
// sorted by path. An empty result means the tree is fresh.
func Diff(dir string, out *Output) ([]Problem, error) {
	var problems []Problem
	onDisk := map[string]bool{}
	// What the MANIFEST on disk lists, and the directories holding it,
	// generate removes with the old tree; anything else it refuses.
	listed, _ := ReadManifestFiles(filepath.Join(dir, ManifestName))
	listedUnder := map[string]bool{}
	for p := range listed {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			listedUnder[d] = true
		}
	}
	// Directories that hold no produced file (an empty one included) are
	// extra as a whole, as generate's check of the tree counts them.
	produced := map[string]bool{}
	for p := range out.Files {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			produced[d] = true
		}
	}
	err := filepath.WalkDir(dir, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) && full == dir {
				return fs.SkipAll
			}
			return err
		}
		if d.IsDir() {
			rel, _ := filepath.Rel(dir, full)
			if rel = filepath.ToSlash(rel); rel != "." && !produced[rel] {
				problems = append(problems, Problem{Path: rel + "/", Kind: "extra", Listed: listedUnder[rel]})
				return fs.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(dir, full)
		onDisk[filepath.ToSlash(rel)] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", dir, err)
	}
	for _, p := range out.Paths() {
		if !onDisk[p] {
			problems = append(problems, Problem{Path: p, Kind: "missing"})
			continue
		}
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", dir, err)
		}
		if want := out.Files[p]; !bytes.Equal(got, want) {
			d := diff.Diff("disk/"+p, got, "generated/"+p, want)
			problems = append(problems, Problem{Path: p, Kind: "stale", Diff: truncate(string(d), 60)})
		}
	}
	for p := range onDisk {
		if _, ok := out.Files[p]; !ok {
			problems = append(problems, Problem{Path: p, Kind: "extra", Listed: listed[p]})
		}
	}
	sort.Slice(problems, func(i, j int) bool { return problems[i].Path < problems[j].Path })
	return problems, nil
}

// ReadManifestFiles reads a collgen MANIFEST and returns the paths (slash
// form, relative to the tree) of the files it lists; ok is false when path
// is not a collgen MANIFEST (missing, unreadable, or without its header).
func ReadManifestFiles(path string) (files map[string]bool, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	if !sc.Scan() || sc.Text() != ManifestHeader {
		return nil, false
	}
	files = map[string]bool{}
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 3 && fields[0] == "file" {
			files[fields[2]] = true
		}
	}
	return files, sc.Err() == nil
}

// truncate keeps the first n lines of a diff.
func truncate(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) <= n {
		return s
	}
	return strings.Join(lines[:n], "") + fmt.Sprintf("... (%d more lines)\n", len(lines)-n)
}
