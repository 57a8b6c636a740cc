package cuda

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestCachePrune: entries unused for the age go with their lock files; a
// used entry stays; a lock someone holds stays even without an entry;
// temporary files of killed writers go; other files in the directory are
// not the cache's to remove. A hit renews an old entry's time.
func TestCachePrune(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	old, used, held := CacheKey{1}, CacheKey{2}, CacheKey{3}
	for _, k := range []CacheKey{old, used} {
		if err := c.Put(k, []byte("\x7fELF image")); err != nil {
			t.Fatal(err)
		}
		unlock, err := c.lock(context.Background(), k, false)
		if err != nil {
			t.Fatal(err)
		}
		unlock()
	}
	unlockHeld, err := c.lock(context.Background(), held, false)
	if err != nil {
		t.Fatal(err)
	}
	defer unlockHeld()
	month := time.Now().Add(-30 * 24 * time.Hour)
	for _, k := range []CacheKey{old, used} {
		if err := os.Chtimes(c.Path(k), month, month); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(c.Dir, ".tmp-0102-killed")
	mine := filepath.Join(c.Dir, "notes.txt")
	for _, p := range []string{tmp, mine} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, month, month)
	}
	if _, ok := c.Get(used); !ok {
		t.Fatal("used entry missing")
	}
	if st, _ := os.Stat(c.Path(used)); time.Since(st.ModTime()) > time.Minute {
		t.Fatalf("a hit left the entry's time at %v", st.ModTime())
	}
	u, err := c.Usage()
	if err != nil || u.Entries != 2 || u.Locks != 3 || u.Temps != 1 || !u.Oldest.Before(u.Newest) {
		t.Fatalf("usage %+v, %v", u, err)
	}
	removed, err := c.Prune(time.Now().Add(-7 * 24 * time.Hour))
	if err != nil || removed.Entries != 1 || removed.Locks != 1 || removed.Temps != 1 {
		t.Fatalf("removed %+v, %v; want old's entry and lock and the temporary file", removed, err)
	}
	var names []string
	ents, _ := os.ReadDir(c.Dir)
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := []string{used.String() + ".cgbin", used.String() + ".lock", held.String() + ".lock", "notes.txt"}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("left %v, want %v", names, want)
	}
	// Prune(now) empties the cache but for the held lock.
	if removed, err = c.Prune(time.Now()); err != nil || removed.Entries != 1 || removed.Locks != 1 {
		t.Fatalf("second prune removed %+v, %v", removed, err)
	}
	if u, _ = c.Usage(); u.Entries != 0 || u.Locks != 1 {
		t.Fatalf("after emptying: %+v", u)
	}
	// A directory that does not exist is an empty cache.
	if u, err := (&Cache{Dir: filepath.Join(c.Dir, "none")}).Usage(); err != nil || u != (CacheUsage{}) {
		t.Fatalf("missing directory: %+v, %v", u, err)
	}
}
