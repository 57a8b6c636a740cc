//go:build cgo

// Package cudatest holds helpers for GPU tests of the runtime packages:
// device discovery that skips cleanly on machines without CUDA, and two
// small rendezvous.Store implementations (in-memory for goroutine ranks,
// directory-backed for ranks in separate processes).
package cudatest

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// Devices opens n devices (ordinals 0..n-1) and registers their Close with
// t.Cleanup. It skips the test, with the reason, when libcuda cannot be
// loaded or fewer than n devices exist.
func Devices(t testing.TB, n int) []*cuda.Device {
	t.Helper()
	count, err := cuda.DeviceCount()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if count < n {
		t.Skipf("test needs %d CUDA device(s), found %d", n, count)
	}
	devs := make([]*cuda.Device, n)
	for i := range devs {
		d, err := cuda.Open(i)
		if err != nil {
			t.Fatalf("open device %d: %v", i, err)
		}
		t.Cleanup(func() { d.Close() })
		devs[i] = d
	}
	return devs
}

// defaultTimeout bounds waits whose ctx has no deadline.
const defaultTimeout = 2 * time.Minute

func withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultTimeout)
}

// MemStore is an in-memory rendezvous.Store for ranks in one process.
type MemStore struct {
	mu     sync.Mutex
	kv     map[string][]byte
	notify chan struct{} // closed and replaced on every change
	closed bool
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	return &MemStore{kv: map[string][]byte{}, notify: make(chan struct{})}
}

var _ rendezvous.Store = (*MemStore)(nil)

func (s *MemStore) changed() {
	close(s.notify)
	s.notify = make(chan struct{})
}

// Set implements rendezvous.Store.
func (s *MemStore) Set(ctx context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return rendezvous.ErrClosed
	}
	s.kv[key] = bytes.Clone(value)
	s.changed()
	return nil
}

// Get implements rendezvous.Store.
func (s *MemStore) Get(ctx context.Context, key string) ([]byte, error) {
	if err := s.Wait(ctx, key); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.kv[key]), nil
}

// Wait implements rendezvous.Store.
func (s *MemStore) Wait(ctx context.Context, keys ...string) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return rendezvous.ErrClosed
		}
		var missing []string
		for _, k := range keys {
			if _, ok := s.kv[k]; !ok {
				missing = append(missing, k)
			}
		}
		ch := s.notify
		s.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for %v", rendezvous.ErrTimeout, missing)
		}
	}
}

// Add implements rendezvous.Store.
func (s *MemStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, rendezvous.ErrClosed
	}
	var v int64
	if b, ok := s.kv[key]; ok {
		var err error
		if v, err = strconv.ParseInt(string(b), 10, 64); err != nil {
			return 0, fmt.Errorf("memstore: add %s: %w", key, err)
		}
	}
	v += delta
	s.kv[key] = []byte(strconv.FormatInt(v, 10))
	s.changed()
	return v, nil
}

// CompareAndSet implements rendezvous.Store.
func (s *MemStore) CompareAndSet(ctx context.Context, key string, old, new []byte) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false, rendezvous.ErrClosed
	}
	cur, ok := s.kv[key]
	if (old == nil && !ok) || (old != nil && ok && bytes.Equal(cur, old)) {
		s.kv[key] = bytes.Clone(new)
		s.changed()
		return bytes.Clone(new), true, nil
	}
	return bytes.Clone(cur), false, nil
}

// Delete implements rendezvous.Store.
func (s *MemStore) Delete(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, rendezvous.ErrClosed
	}
	_, ok := s.kv[key]
	delete(s.kv, key)
	s.changed()
	return ok, nil
}

// Close implements rendezvous.Store.
func (s *MemStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.changed()
	}
	return nil
}

// FileStore is a rendezvous.Store in a directory shared by processes on
// one host: one file per key (written to a temp file and renamed), waits
// by polling, Add and CompareAndSet under an flock of Dir/.lock.
type FileStore struct {
	Dir string
}

// NewFileStore makes dir if needed and returns a store in it.
func NewFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &FileStore{Dir: dir}, nil
}

var _ rendezvous.Store = (*FileStore)(nil)

func (s *FileStore) path(key string) string {
	return filepath.Join(s.Dir, "k-"+hex.EncodeToString([]byte(key)))
}

func (s *FileStore) write(key string, value []byte) error {
	tmp, err := os.CreateTemp(s.Dir, ".tmp-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(value)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), s.path(key))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

func (s *FileStore) locked(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(s.Dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return fn()
}

// Set implements rendezvous.Store.
func (s *FileStore) Set(ctx context.Context, key string, value []byte) error {
	return s.write(key, value)
}

// Get implements rendezvous.Store.
func (s *FileStore) Get(ctx context.Context, key string) ([]byte, error) {
	if err := s.Wait(ctx, key); err != nil {
		return nil, err
	}
	return os.ReadFile(s.path(key))
}

// Wait implements rendezvous.Store.
func (s *FileStore) Wait(ctx context.Context, keys ...string) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	for {
		var missing []string
		for _, k := range keys {
			if _, err := os.Stat(s.path(k)); err != nil {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for %v", rendezvous.ErrTimeout, missing)
		}
	}
}

// Add implements rendezvous.Store.
func (s *FileStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var v int64
	err := s.locked(func() error {
		if b, err := os.ReadFile(s.path(key)); err == nil {
			if v, err = strconv.ParseInt(string(b), 10, 64); err != nil {
				return err
			}
		}
		v += delta
		return s.write(key, []byte(strconv.FormatInt(v, 10)))
	})
	return v, err
}

// CompareAndSet implements rendezvous.Store.
func (s *FileStore) CompareAndSet(ctx context.Context, key string, old, new []byte) (cur []byte, swapped bool, err error) {
	err = s.locked(func() error {
		b, rerr := os.ReadFile(s.path(key))
		exists := rerr == nil
		if (old == nil && !exists) || (old != nil && exists && bytes.Equal(b, old)) {
			cur, swapped = bytes.Clone(new), true
			return s.write(key, new)
		}
		cur = b
		return nil
	})
	return cur, swapped, err
}

// Delete implements rendezvous.Store.
func (s *FileStore) Delete(ctx context.Context, key string) (bool, error) {
	err := os.Remove(s.path(key))
	if os.IsNotExist(err) {
		return false, nil
	}
	return err == nil, err
}

// Close implements rendezvous.Store; the directory is left for the caller.
func (s *FileStore) Close() error { return nil }

// Barrier blocks until world ranks have reached the barrier called name.
func Barrier(ctx context.Context, s rendezvous.Store, name string, world int) error {
	n, err := s.Add(ctx, name+"/count", 1)
	if err != nil {
		return err
	}
	if n == int64(world) {
		if err := s.Set(ctx, name+"/done", []byte{1}); err != nil {
			return err
		}
	}
	return s.Wait(ctx, name+"/done")
}
