//go:build unix

package cuda

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/fdpass/fdpasstest"
)

// envLockAs names the cache directory the copy of this test run as user
// nobody locks in.
const envLockAs = "COLLGEN_TEST_LOCK_DIR"

// TestCacheLockOtherUser: a user sharing a cache directory takes the lock
// of a key whose lock file another user made (0644: readable, not
// writable by others), so the two share the work instead of both
// compiling. The copy of the test as nobody opens the file and locks it.
func TestCacheLockOtherUser(t *testing.T) {
	if dir := os.Getenv(envLockAs); dir != "" {
		c := &Cache{Dir: dir}
		unlock, err := c.lock(context.Background(), CacheKey{1}, false)
		if err != nil {
			t.Fatalf("foreign lock: %v", err)
		}
		unlock()
		t.Log("foreign lock: taken")
		return
	}
	// t.TempDir's parents are private to this user: a directory of its
	// own, open to all as a shared cache is.
	shared, err := os.MkdirTemp("", "collgen-cache-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	c := &Cache{Dir: shared}
	unlock, err := c.lock(context.Background(), CacheKey{1}, false) // this user makes the lock file
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	if _, err := os.Stat(filepath.Join(shared, CacheKey{1}.String()+".lock")); err != nil {
		t.Fatal(err)
	}
	cmd := fdpasstest.AsNobody(t, []string{"-test.run=^TestCacheLockOtherUser$", "-test.v"}, envLockAs+"="+shared)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "foreign lock: taken") {
		t.Fatalf("user nobody could not take the lock another user's file holds: %v\n%s", err, out)
	}
}
