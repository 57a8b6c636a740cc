package etcdstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/etcdstore"
)

// TestEtcdGoneOpsTimeout: with the cluster gone, Set, Add, CompareAndSet,
// Delete and Barrier end at their deadline with an error wrapping
// rendezvous.ErrTimeout (and still context.DeadlineExceeded), as waits do
// and as the TCP store's calls do (TestTCPServerGoneTimeout, whose comment
// counts on etcd doing the same). They matched only
// context.DeadlineExceeded.
func TestEtcdGoneOpsTimeout(t *testing.T) {
	ep, stop := startEtcdStop(t)
	s := open(t, etcdstore.Config{Endpoints: []string{ep}})
	stop()
	for name, call := range map[string]func(ctx context.Context) error{
		"Set":           func(ctx context.Context) error { return s.Set(ctx, "k", []byte("v")) },
		"Add":           func(ctx context.Context) error { _, err := s.Add(ctx, "n", 1); return err },
		"CompareAndSet": func(ctx context.Context) error { _, _, err := s.CompareAndSet(ctx, "k", nil, []byte("v")); return err },
		"Delete":        func(ctx context.Context) error { _, err := s.Delete(ctx, "k"); return err },
		"Barrier":       func(ctx context.Context) error { return rendezvous.Barrier(ctx, s, "b", 0, 2) },
	} {
		start := time.Now()
		err := call(shortCtx(t, 300*time.Millisecond))
		if !errors.Is(err, rendezvous.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with etcd gone: %v; want rendezvous.ErrTimeout and context.DeadlineExceeded", name, err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%s took %v past a 300 ms deadline", name, d)
		}
	}
}
