package storetest

import (
	"context"
	"slices"
	"sync"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// KeyStore wraps a store and records which keys exist in it, for tests
// that assert what a group leaves behind. Only keys written and deleted
// through the KeyStore are seen; it is safe for concurrent use.
type KeyStore struct {
	// Store is the wrapped store: reads and Close go to it unchanged.
	rendezvous.Store
	mu   sync.Mutex
	keys map[string]bool
}

// NewKeyStore wraps s (the caller closes s, or the KeyStore: Close is s's).
func NewKeyStore(s rendezvous.Store) *KeyStore {
	return &KeyStore{Store: s, keys: map[string]bool{}}
}

func (s *KeyStore) note(k string, live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if live {
		s.keys[k] = true
	} else {
		delete(s.keys, k)
	}
}

// Set is the wrapped store's Set, noting key as live.
func (s *KeyStore) Set(ctx context.Context, key string, value []byte) error {
	err := s.Store.Set(ctx, key, value)
	if err == nil {
		s.note(key, true)
	}
	return err
}

// Add is the wrapped store's Add, noting key as live.
func (s *KeyStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	n, err := s.Store.Add(ctx, key, delta)
	if err == nil {
		s.note(key, true)
	}
	return n, err
}

// CompareAndSet is the wrapped store's CompareAndSet, noting key as live
// after a swap (or gone, where new is nil).
func (s *KeyStore) CompareAndSet(ctx context.Context, key string, old, new []byte) ([]byte, bool, error) {
	cur, ok, err := s.Store.CompareAndSet(ctx, key, old, new)
	if err == nil && ok {
		s.note(key, new != nil)
	}
	return cur, ok, err
}

// Delete is the wrapped store's Delete, noting key as gone.
func (s *KeyStore) Delete(ctx context.Context, key string) (bool, error) {
	ok, err := s.Store.Delete(ctx, key)
	if err == nil {
		s.note(key, false)
	}
	return ok, err
}

// Live returns the keys that exist now, sorted.
func (s *KeyStore) Live() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.keys))
	for k := range s.keys {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
