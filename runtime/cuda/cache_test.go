package cuda

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDefaultCacheDirEnv: $COLLGEN_CACHE_DIR as a user writes it where no
// shell expands it (an env file, a unit's Environment=): a leading ~ is
// the home directory, not a directory named "~" under the working
// directory, and a relative path is made absolute once, so a later
// chdir, or a rank started elsewhere, does not move the cache.
func TestDefaultCacheDirEnv(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"~":           home,
		"~/cg":        filepath.Join(home, "cg"),
		"rel/cache":   filepath.Join(wd, "rel", "cache"),
		"/abs/cache/": "/abs/cache",
	} {
		t.Setenv(EnvCacheDir, in)
		if got, err := DefaultCacheDir(); err != nil || got != want {
			t.Errorf("%s=%q: %q, %v; want %q", EnvCacheDir, in, got, err, want)
		}
	}
}

// TestCachePutRemovesStaleTemps: a Put that a killed process left half
// done (its temporary file) is removed by the next Put of that entry; a
// temporary file as young as a Put in progress is left to its writer.
func TestCachePutRemovesStaleTemps(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	var k CacheKey
	k[0] = 9
	prefix := filepath.Join(c.Dir, ".tmp-"+k.String()[:16]+"-")
	stale, fresh := prefix+"111", prefix+"222"
	for _, f := range []string{stale, fresh} {
		if err := os.WriteFile(f, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(k, []byte("\x7fELF")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a killed Put's temporary file is still there: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a Put in progress lost its temporary file: %v", err)
	}
}
