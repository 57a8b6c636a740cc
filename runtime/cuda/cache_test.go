package cuda

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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

// TestCacheKeySeparatesNVRTCBuilds: two builds of one NVRTC major.minor
// (a toolkit update, a patched libnvrtc at the same path) have different
// cache keys. The key held only "nvrtc 13.0", so a CUBIN or PTX of the
// old build answered for the new one. The build is read through the
// soname's symbolic link, and is stable while the file is unchanged.
func TestCacheKeySeparatesNVRTCBuilds(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "libnvrtc.so.13.0.48")
	link := filepath.Join(dir, "libnvrtc.so.13")
	if err := os.WriteFile(real, []byte("build one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(real), link); err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(real) // TempDir may be under a link
	if err != nil {
		t.Fatal(err)
	}
	var c Cache
	req := fakeRequests(1)[0]
	key := func() (CacheKey, string) {
		b := libraryBuild(link)
		if b == "" || !strings.HasPrefix(b, real+" ") {
			t.Fatalf("libraryBuild(%s) = %q; want it to name %s", link, b, real)
		}
		return c.keyFor(req, nvrtcName(13, 0, b)), b
	}
	first, b1 := key()
	if again, _ := key(); again != first {
		t.Fatal("the key of an unchanged library changed")
	}
	if b := libraryBuild(real); b != b1 {
		t.Errorf("the file itself is %q, its link %q", b, b1)
	}
	// A patched build of another size, then one of the same size but
	// written later (a reinstall may look like this too: one recompile).
	if err := os.WriteFile(real, []byte("build two, longer"), 0o644); err != nil {
		t.Fatal(err)
	}
	second, b2 := key()
	if second == first {
		t.Errorf("same key for two NVRTC 13.0 builds %q and %q", b1, b2)
	}
	if err := os.WriteFile(real, []byte("build 3, same size"), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(real, later, later); err != nil {
		t.Fatal(err)
	}
	if third, b3 := key(); third == second || third == first {
		t.Errorf("same key for NVRTC 13.0 builds %q, %q and %q", b1, b2, b3)
	}
	for _, f := range []string{"", filepath.Join(dir, "missing.so"), dir} {
		if b := libraryBuild(f); b != "" {
			t.Errorf("libraryBuild(%q) = %q, want \"\" (no file to identify)", f, b)
		}
	}
}

// TestCacheKeyNamesLoadedNVRTC: the key's compiler is the loaded NVRTC's
// version and the build of the file it was loaded from, even when it was
// opened by a bare soname the dynamic linker searched for. NVRTC only,
// no GPU.
func TestCacheKeyNamesLoadedNVRTC(t *testing.T) {
	maj, min, path, err := NVRTCVersion()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	compiler, err := nvrtcCompiler()
	if err != nil {
		t.Fatalf("NVRTC %d.%d (%s) loaded but has no cache key: %v", maj, min, path, err)
	}
	prefix := nvrtcName(maj, min, "")
	file, _, ok := strings.Cut(strings.TrimPrefix(compiler, prefix), " size ")
	if !strings.HasPrefix(compiler, prefix) || !ok || !filepath.IsAbs(file) {
		t.Fatalf("compiler %q: want %q, the library's absolute path, its size and time", compiler, prefix)
	}
	if b := libraryBuild(file); compiler != nvrtcName(maj, min, b) {
		t.Errorf("compiler %q; the file it names is %q now", compiler, b)
	}
	t.Logf("NVRTC loaded as %s: %s", path, compiler)
	var c Cache
	req := fakeRequests(1)[0]
	if k, err := c.Key(req); err != nil || k != c.keyFor(req, compiler) {
		t.Errorf("Key = %v, %v; want the key for %q", k, err, compiler)
	}
}
