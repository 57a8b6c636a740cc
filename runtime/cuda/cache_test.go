package cuda

import (
	"os"
	"path/filepath"
	"testing"
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
