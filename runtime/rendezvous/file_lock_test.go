package rendezvous

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFileStoreWriterWaitingForLockBlocksNoOne: while one goroutine's Add
// waits (up to its long deadline) for the cross-process lock held by a
// stopped process, the same handle's Get of a key that exists, a Set with
// a short deadline and Close must not wait with it: Get needs no lock at
// all, Set fails at its own deadline, and Close returns at once and ends
// the waiting Add with ErrClosed.
func TestFileStoreWriterWaitingForLockBlocksNoOne(t *testing.T) {
	dir := t.TempDir()
	s := openFileStore(t, dir)
	if err := s.Set(context.Background(), "here", []byte("v")); err != nil {
		t.Fatal(err)
	}
	holder, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if ok, err := tryFlock(holder); !ok || err != nil {
		t.Fatalf("holder's flock: %v %v", ok, err)
	}
	defer funlock(holder)

	addDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := s.Add(ctx, "n", 1)
		addDone <- err
	}()
	time.Sleep(100 * time.Millisecond) // the Add is polling for the flock

	within := func(name string, d time.Duration, fn func() error) error {
		t.Helper()
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- fn() }()
		select {
		case err := <-done:
			return err
		case <-time.After(d):
			t.Errorf("%s still running after %v (started %v ago)", name, d, time.Since(start).Round(time.Millisecond))
			return nil
		}
	}

	err = within("Get of a present key (deadline 200ms)", 3*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := s.Get(ctx, "here")
		return err
	})
	if err != nil {
		t.Errorf("Get of a present key: %v", err)
	}
	err = within("Set (deadline 200ms)", 3*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return s.Set(ctx, "k", []byte("v"))
	})
	if err != nil && !errors.Is(err, ErrTimeout) {
		t.Errorf("Set under a held lock: %v, want ErrTimeout", err)
	}
	within("Close", 3*time.Second, s.Close)
	select {
	case err := <-addDone:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Add waiting for the lock when the store closed: %v, want ErrClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("Add waiting for the lock still waits 3 s after Close")
	}
}
