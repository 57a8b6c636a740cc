package rendezvous

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
)

// fileStore keeps one file per key in a directory on a filesystem every rank
// can see. Readers never lock: writers publish values with an atomic rename,
// so a reader sees a whole old value or a whole new one. Writers (Set, Add,
// CompareAndSet, Delete) hold an exclusive flock on dir/.lock so that
// read-modify-write ops are atomic across processes.
type fileStore struct {
	dir string
	// writer (capacity 1) serialises this process's writers (flock is per
	// open file); it is taken with the writer's ctx, so a writer waiting
	// for a lock held by a stopped process blocks no reader, and no other
	// writer past its own deadline.
	writer chan struct{}
	lock   *os.File
	closed atomic.Bool
	// done is closed by Close: writers waiting for the lock stop at once.
	done    chan struct{}
	timeout time.Duration
}

// File names: "k." + base64url(key) keeps names reversible for debugging;
// keys too long for a file name fall back to "h." + sha256(key).
const maxEncodedKey = 200

// filePollMin and filePollMax bound the polling interval of a file store
// wait; it backs off from the first to the second.
const (
	filePollMin = 2 * time.Millisecond
	filePollMax = 50 * time.Millisecond
)

// NewFileStore returns a Store kept in dir (created if missing), for ranks
// that share a filesystem but no network. Values are published with atomic
// renames and Add/CompareAndSet/Delete hold an flock on dir/.lock, so the
// store is safe across processes as long as the filesystem honours flock
// (local filesystems and NFSv4 do). The store never deletes dir.
func NewFileStore(dir string) (Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("rendezvous: file store: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: file store: %w", err)
	}
	return &fileStore{dir: dir, writer: make(chan struct{}, 1), lock: lock, done: make(chan struct{}), timeout: DefaultTimeout}, nil
}

func (f *fileStore) path(key string) string {
	enc := base64.RawURLEncoding.EncodeToString([]byte(key))
	if len(enc) <= maxEncodedKey {
		return filepath.Join(f.dir, "k."+enc)
	}
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(f.dir, "h."+hex.EncodeToString(sum[:]))
}

// locked runs fn holding both the in-process mutex and the cross-process
// flock. The flock is tried without blocking, backing off as poll does,
// until ctx's deadline (or the store's default timeout): a process stopped
// (SIGSTOP) or hung while it holds the lock must not hang every other
// rank, which then fails with ErrTimeout. (A blocking flock hung the
// survivors of a stopped rank in TestStoppedRankTimesOut.)
func (f *fileStore) locked(ctx context.Context, fn func() error) error {
	ctx, cancel := WithDefaultTimeout(ctx, f.timeout)
	defer cancel()
	if f.closed.Load() {
		return ErrClosed
	}
	select {
	case f.writer <- struct{}{}:
	case <-f.done:
		return ErrClosed
	case <-ctx.Done():
		if ctx.Err() == context.Canceled {
			return fmt.Errorf("rendezvous: file store: lock %s: %w", f.lock.Name(), CauseErr(ctx))
		}
		return fmt.Errorf("%w: file store: lock %s still held by another writer of this process at the deadline (waiting for a stopped or hung rank?)", ErrTimeout, f.lock.Name())
	}
	defer func() { <-f.writer }()
	if f.closed.Load() {
		return ErrClosed
	}
	for delay := filePollMin; ; delay = min(delay*2, filePollMax) {
		ok, err := tryFlock(f.lock)
		if err != nil {
			return fmt.Errorf("rendezvous: file store: lock %s: %w", f.lock.Name(), err)
		}
		if ok {
			break
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-f.done:
			t.Stop()
			return ErrClosed
		case <-ctx.Done():
			t.Stop()
			if ctx.Err() == context.Canceled {
				return fmt.Errorf("rendezvous: file store: lock %s: %w", f.lock.Name(), CauseErr(ctx))
			}
			return fmt.Errorf("%w: file store: lock %s still held by another process at the deadline (a stopped or hung rank?)", ErrTimeout, f.lock.Name())
		}
	}
	defer funlock(f.lock)
	return fn()
}

// write publishes value under key with an atomic rename.
func (f *fileStore) write(key string, value []byte) error {
	tmp, err := os.CreateTemp(f.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("rendezvous: file store: %w", err)
	}
	_, werr := tmp.Write(value)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("rendezvous: file store: write %q: %w", key, err)
	}
	if err := os.Rename(tmp.Name(), f.path(key)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("rendezvous: file store: write %q: %w", key, err)
	}
	return nil
}

// read returns key's value, or nil (not an error) if it is absent.
func (f *fileStore) read(key string) ([]byte, error) {
	v, err := os.ReadFile(f.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rendezvous: file store: read %q: %w", key, err)
	}
	return present(v), nil
}

func (f *fileStore) isClosed() bool { return f.closed.Load() }

func (f *fileStore) Set(ctx context.Context, key string, value []byte) error {
	return f.locked(ctx, func() error { return f.write(key, value) })
}

func (f *fileStore) Get(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := f.poll(ctx, []string{key}, func() ([]string, error) {
		var err error
		v, err = f.read(key)
		if err != nil || v != nil {
			return nil, err
		}
		return []string{key}, nil
	})
	return v, err
}

func (f *fileStore) Wait(ctx context.Context, keys ...string) error {
	return f.poll(ctx, keys, func() ([]string, error) {
		var missing []string
		for _, k := range keys {
			_, err := os.Stat(f.path(k))
			if errors.Is(err, fs.ErrNotExist) {
				missing = append(missing, k)
			} else if err != nil {
				return nil, fmt.Errorf("rendezvous: file store: %w", err)
			}
		}
		return missing, nil
	})
}

// poll calls check, backing off, until it reports nothing missing, fails, or
// the deadline passes.
func (f *fileStore) poll(ctx context.Context, keys []string, check func() ([]string, error)) error {
	ctx, cancel := WithDefaultTimeout(ctx, f.timeout)
	defer cancel()
	delay := filePollMin
	for {
		if f.isClosed() {
			return ErrClosed
		}
		missing, err := check()
		if err != nil || len(missing) == 0 {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if missing, err := check(); err != nil || len(missing) == 0 {
				return err
			} else if ctx.Err() == context.Canceled {
				return fmt.Errorf("rendezvous: waiting for %d keys: %w", len(missing), CauseErr(ctx))
			} else {
				return &WaitError{Missing: missing}
			}
		}
		delay = min(delay*2, filePollMax)
	}
}

func (f *fileStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var n int64
	err := f.locked(ctx, func() error {
		v, err := f.read(key)
		if err != nil {
			return err
		}
		if n, err = parseCounter(key, v); err != nil {
			return err
		}
		if delta == 0 && v != nil {
			return nil // a read: leave the file as it is
		}
		if n, err = AddCounter(key, n, delta); err != nil {
			return err
		}
		return f.write(key, strconv.AppendInt(nil, n, 10))
	})
	return n, err
}

func (f *fileStore) CompareAndSet(ctx context.Context, key string, old, new []byte) ([]byte, bool, error) {
	var cur []byte
	var swapped bool
	err := f.locked(ctx, func() error {
		var err error
		if cur, err = f.read(key); err != nil {
			return err
		}
		if (old == nil) != (cur == nil) || (old != nil && !bytes.Equal(cur, old)) {
			return nil
		}
		if err := f.write(key, new); err != nil {
			return err
		}
		cur, swapped = present(new), true
		return nil
	})
	return cur, swapped, err
}

func (f *fileStore) Delete(ctx context.Context, key string) (bool, error) {
	var existed bool
	err := f.locked(ctx, func() error {
		err := os.Remove(f.path(key))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("rendezvous: file store: delete %q: %w", key, err)
		}
		existed = true
		return nil
	})
	return existed, err
}

// Close ends writers waiting for the lock with ErrClosed at once, waits
// for a writer holding it to finish (a rename), and closes the lock file.
func (f *fileStore) Close() error {
	if !f.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(f.done)
	f.writer <- struct{}{} // never given back: no writer runs after this
	return f.lock.Close()
}
