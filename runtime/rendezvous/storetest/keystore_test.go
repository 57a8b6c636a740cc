package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// slowSet is a store whose Set, once applied, signals applied and takes
// a while to return (a reply on its way back).
type slowSet struct {
	rendezvous.Store
	applied chan struct{}
}

func (s *slowSet) Set(ctx context.Context, key string, value []byte) error {
	err := s.Store.Set(ctx, key, value)
	close(s.applied)
	time.Sleep(50 * time.Millisecond)
	return err
}

// A Delete of a key whose Set is still returning deletes it after the
// Set: Live then says the key is gone, as the store does. The notes
// followed the calls' returns, so the Set's, later, left the deleted key
// live.
func TestKeyStoreFollowsTheStore(t *testing.T) {
	ctx := context.Background()
	mem := rendezvous.NewMemStore()
	s := NewKeyStore(&slowSet{Store: mem, applied: make(chan struct{})})
	set := make(chan error, 1)
	go func() { set <- s.Set(ctx, "k", []byte("v")) }()
	<-s.Store.(*slowSet).applied
	if _, err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := <-set; err != nil {
		t.Fatal(err)
	}
	_, absent, err := mem.CompareAndSet(ctx, "k", nil, []byte("probe")) // swaps only if absent
	if err != nil || !absent {
		t.Fatalf("the store still has k (%v): the Delete ran before the Set", err)
	}
	if live := s.Live(); len(live) != 0 {
		t.Fatalf("Live = %q, but the store has no key", live)
	}
}

// A swap to a nil value stores an empty one (every Store does): the key
// is live, not gone.
func TestKeyStoreCompareAndSetNil(t *testing.T) {
	ctx := context.Background()
	s := NewKeyStore(rendezvous.NewMemStore())
	if _, ok, err := s.CompareAndSet(ctx, "k", nil, nil); err != nil || !ok {
		t.Fatalf("CompareAndSet = %v, %v", ok, err)
	}
	if v, err := s.Get(ctx, "k"); err != nil || v == nil {
		t.Fatalf("Get = %q, %v; want an empty value", v, err)
	}
	if live := s.Live(); !slices.Equal(live, []string{"k"}) {
		t.Fatalf("Live = %q, want [k]", live)
	}
}
