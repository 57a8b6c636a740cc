package cuda

import (
	"path/filepath"
	"testing"
)

// TestDefaultCacheDirRelativeXDG: the XDG base directory spec makes a
// relative $XDG_CACHE_HOME invalid, to be ignored; docs/cold-start.md's
// order then goes on to ~/.cache/collgen. os.UserCacheDir refuses it
// instead, so DefaultCacheDir failed: `collgen cache` exited 1 and
// comm.New compiled every kernel without a cache.
func TestDefaultCacheDirRelativeXDG(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv(EnvCacheDir, "")
	t.Setenv("XDG_CACHE_HOME", "relative/cache")
	got, err := DefaultCacheDir()
	if want := filepath.Join(home, ".cache", "collgen"); err != nil || got != want {
		t.Errorf("DefaultCacheDir() = %q, %v; want %q", got, err, want)
	}
}
