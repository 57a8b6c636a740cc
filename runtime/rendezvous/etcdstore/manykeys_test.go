package etcdstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/etcdstore"
)

// TestWaitManyKeys: Wait (and Get's snapshot) of more keys than etcd's
// --max-txn-ops (128 by default) must work: Join, Barrier and AllGather
// wait for one key per rank, so a group of more than 128 ranks on etcd
// failed every rendezvous with "too many operations in txn request".
func TestWaitManyKeys(t *testing.T) {
	s := open(t, etcdstore.Config{Endpoints: []string{startEtcd(t)}, Prefix: "/manykeys/"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 300
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k/%d", i)
		if err := s.Set(ctx, keys[i], []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Wait(ctx, keys...); err != nil {
		t.Fatalf("Wait for %d present keys: %v", n, err)
	}
	// A missing key past the first 128 is still waited for and named.
	wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer wcancel()
	err := s.Wait(wctx, append(keys, "absent")...)
	we, ok := err.(*rendezvous.WaitError)
	if !ok || len(we.Missing) != 1 || we.Missing[0] != "absent" {
		t.Fatalf("Wait with one missing key after %d present: %v; want a WaitError naming it", n, err)
	}
	// And a group of more than 128 ranks forms.
	const world = 130
	errs := make(chan error, world)
	for r := range world {
		go func() { errs <- rendezvous.Join(ctx, s, "big", r, world) }()
	}
	for range world {
		if err := <-errs; err != nil {
			t.Fatalf("Join at world %d: %v", world, err)
		}
	}
}
