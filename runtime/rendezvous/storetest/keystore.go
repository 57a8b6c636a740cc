package storetest

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// KeyStore wraps a store and records which keys exist in it, for tests
// that assert what a group leaves behind. Only keys written and deleted
// through the KeyStore are seen. It is safe for concurrent use, and exact
// once the operations have returned: operations on one key run one at a
// time, each noted before the next starts, so the notes follow the
// store's order (they could cross, and a Set and a Delete of one key at
// once left a deleted key live or a live one gone). An operation that
// returns an error is taken as not applied, which holds for the
// in-memory store (its failed operations change nothing); a remote
// store's may have been applied.
type KeyStore struct {
	// Store is the wrapped store: reads and Close go to it unchanged.
	rendezvous.Store
	// keyMu serializes the operations on one key (a key's stripe), so
	// operations on different keys still run at once.
	keyMu [64]sync.Mutex
	seed  maphash.Seed
	mu    sync.Mutex
	keys  map[string]bool
}

// NewKeyStore wraps s (the caller closes s, or the KeyStore: Close is s's).
func NewKeyStore(s rendezvous.Store) *KeyStore {
	return &KeyStore{Store: s, keys: map[string]bool{}, seed: maphash.MakeSeed()}
}

// on runs op, the store operation on key, with key's stripe held, and
// notes key live or gone as op says (unchanged when op returns false).
func (s *KeyStore) on(key string, op func() (note, live bool)) {
	l := &s.keyMu[maphash.String(s.seed, key)%uint64(len(s.keyMu))]
	l.Lock()
	defer l.Unlock()
	note, live := op()
	if !note {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if live {
		s.keys[key] = true
	} else {
		delete(s.keys, key)
	}
}

// Set is the wrapped store's Set, noting key as live.
func (s *KeyStore) Set(ctx context.Context, key string, value []byte) error {
	var err error
	s.on(key, func() (bool, bool) {
		err = s.Store.Set(ctx, key, value)
		return err == nil, true
	})
	return err
}

// Add is the wrapped store's Add, noting key as live.
func (s *KeyStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var n int64
	var err error
	s.on(key, func() (bool, bool) {
		n, err = s.Store.Add(ctx, key, delta)
		return err == nil, true
	})
	return n, err
}

// CompareAndSet is the wrapped store's CompareAndSet, noting key as live
// after a swap (a nil new stores an empty value: the key exists).
func (s *KeyStore) CompareAndSet(ctx context.Context, key string, old, new []byte) ([]byte, bool, error) {
	var cur []byte
	var ok bool
	var err error
	s.on(key, func() (bool, bool) {
		cur, ok, err = s.Store.CompareAndSet(ctx, key, old, new)
		return err == nil && ok, true
	})
	return cur, ok, err
}

// Delete is the wrapped store's Delete, noting key as gone.
func (s *KeyStore) Delete(ctx context.Context, key string) (bool, error) {
	var ok bool
	var err error
	s.on(key, func() (bool, bool) {
		ok, err = s.Store.Delete(ctx, key)
		return err == nil, false
	})
	return ok, err
}

// Live returns the keys that exist now, sorted: exactly the store's keys
// (of those the KeyStore saw) once every operation begun has returned;
// while some are in flight, their keys may read either way.
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
