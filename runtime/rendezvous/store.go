// Package rendezvous lets the ranks of a group find each other and agree on
// values before they talk directly: a key-value Store (TCP, file-based or
// in-memory) plus barrier and all-gather built on it.
package rendezvous

import (
	"context"
	"errors"
)

// ErrTimeout is returned (wrapped, with what was missing) when a wait passes
// its deadline.
var ErrTimeout = errors.New("rendezvous: timeout")

// ErrClosed is returned by operations on a closed store.
var ErrClosed = errors.New("rendezvous: store closed")

// Store is a small key-value store shared by the ranks of a group. Every
// method honours ctx: a wait ends with an error wrapping ErrTimeout when the
// ctx deadline (or the store's default timeout, if ctx has none) passes.
//
// Implementations: NewMemStore (goroutine ranks), NewFileStore (a shared
// directory) and DialTCP (a Server run by a rank, `collgen run` or
// `collgen store`); Open and FromEnv pick one from an address.
//
// Values: a present key always reads as a non-nil slice (possibly empty);
// nil means "absent" only in CompareAndSet's old and current. Add keeps
// counters as decimal text, so Get of a counter returns e.g. "3", and Add on
// a non-decimal value fails. Keys are arbitrary strings; Barrier, AllGather
// and Join use keys under "collgen/". All methods are safe for concurrent
// use.
type Store interface {
	// Set stores value under key, replacing any previous value.
	Set(ctx context.Context, key string, value []byte) error
	// Get returns key's value, waiting until some rank sets it.
	Get(ctx context.Context, key string) ([]byte, error)
	// Wait returns once every key exists; on timeout the error names the
	// keys still missing.
	Wait(ctx context.Context, keys ...string) error
	// Add atomically adds delta to the integer counter at key (a missing key
	// counts as 0) and returns the new value.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// CompareAndSet sets key to new if its current value equals old (a nil
	// old means "key absent"). It returns the value now stored and whether
	// the swap happened.
	CompareAndSet(ctx context.Context, key string, old, new []byte) (current []byte, swapped bool, err error)
	// Delete removes key and reports whether it existed.
	Delete(ctx context.Context, key string) (bool, error)
	// Close releases the store's resources (connections, files it owns).
	// Every store of this package (and etcdstore) is safe to close twice;
	// operations on a closed store return ErrClosed.
	Close() error
}
