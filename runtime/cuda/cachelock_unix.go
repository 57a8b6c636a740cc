//go:build unix

package cuda

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lock takes the lock file of key in the cache directory (<key>.lock, an
// flock, so it dies with its holder; the files stay, empty, for the next
// taker). With wait unset a lock held by anyone else (another process, or
// another open of the file in this one) returns errLocked at once;
// otherwise lock polls until it gets the lock or ctx ends. The caller
// calls unlock when the entry is written.
func (c *Cache) lock(ctx context.Context, k CacheKey, wait bool) (unlock func(), err error) {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("cuda: cache: %w", err)
	}
	// Read-only: flock needs no write access, so users sharing the
	// directory lock each other's lock files (made 0644 by whoever came
	// first) and share the work.
	f, err := os.OpenFile(filepath.Join(c.Dir, k.String()+".lock"), os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cuda: cache: %w", err)
	}
	fd := int(f.Fd())
	delay := time.Millisecond
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		switch err {
		case nil:
			return func() { syscall.Flock(fd, syscall.LOCK_UN); f.Close() }, nil
		case syscall.EINTR:
			continue
		case syscall.EWOULDBLOCK:
		default:
			f.Close()
			return nil, fmt.Errorf("cuda: cache lock %s: %w", f.Name(), err)
		}
		if !wait {
			f.Close()
			return nil, errLocked
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}
