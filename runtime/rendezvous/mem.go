package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"
)

// memStore is the in-memory Store; the TCP server keeps its data in one too.
type memStore struct {
	mu   sync.Mutex
	data map[string][]byte
	// changed is closed and replaced on every mutation, waking all waiters;
	// waiters re-check their keys under mu after it closes.
	changed chan struct{}
	closed  bool
	timeout time.Duration
	// size is the bytes of keys and values held; limit, when positive,
	// bounds it (the TCP server's ServerOptions.MaxStoreBytes).
	size, limit int64
}

// peek returns key's value without waiting, nil when absent.
func (m *memStore) peek(key string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.data[key]; ok {
		return present(v)
	}
	return nil
}

// ErrStoreFull is returned (wrapped) when a mutation would take a store
// past its size limit (ServerOptions.MaxStoreBytes for a TCP store).
var ErrStoreFull = errors.New("rendezvous: store full")

// putLocked stores value under key if the size limit allows; mu is held.
func (m *memStore) putLocked(key string, value []byte) error {
	old, ok := m.data[key]
	delta := int64(len(value)) - int64(len(old))
	if !ok {
		delta += int64(len(key))
	}
	if m.limit > 0 && delta > 0 && m.size+delta > m.limit {
		return fmt.Errorf("%w: storing %d bytes under %.64q would pass the %d-byte limit (%d held); delete keys or raise the server's MaxStoreBytes",
			ErrStoreFull, len(value), key, m.limit, m.size)
	}
	m.data[key] = value
	m.size += delta
	return nil
}

// NewMemStore returns an in-memory Store for ranks that are goroutines of
// one process (tests, single-process simulations). All goroutines share the
// returned value; it is safe for concurrent use.
func NewMemStore() Store { return newMemStore(DefaultTimeout) }

func newMemStore(timeout time.Duration) *memStore {
	return &memStore{data: map[string][]byte{}, changed: make(chan struct{}), timeout: timeout}
}

// notifyLocked wakes every waiter; mu must be held.
func (m *memStore) notifyLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *memStore) Set(ctx context.Context, key string, value []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if err := m.putLocked(key, present(value)); err != nil {
		return err
	}
	m.notifyLocked()
	return nil
}

func (m *memStore) Get(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := m.waitFor(ctx, []string{key}, func() { v = present(m.data[key]) })
	return v, err
}

func (m *memStore) Wait(ctx context.Context, keys ...string) error {
	return m.waitFor(ctx, keys, nil)
}

// waitFor blocks until every key exists, then runs then (if non-nil) with mu
// held so it sees the same state the check did.
func (m *memStore) waitFor(ctx context.Context, keys []string, then func()) error {
	ctx, cancel := WithDefaultTimeout(ctx, m.timeout)
	defer cancel()
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return ErrClosed
		}
		missing := m.missingLocked(keys)
		if len(missing) == 0 {
			if then != nil {
				then()
			}
			m.mu.Unlock()
			return nil
		}
		ch := m.changed
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			m.mu.Lock()
			missing = m.missingLocked(keys)
			m.mu.Unlock()
			if len(missing) == 0 {
				continue // arrived just in time; take the success path
			}
			if ctx.Err() == context.Canceled {
				return fmt.Errorf("rendezvous: waiting for %d keys: %w", len(missing), CauseErr(ctx))
			}
			return &WaitError{Missing: missing}
		}
	}
}

func (m *memStore) missingLocked(keys []string) []string {
	var missing []string
	for _, k := range keys {
		if _, ok := m.data[k]; !ok {
			missing = append(missing, k)
		}
	}
	return missing
}

func (m *memStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	n, err := parseCounter(key, m.data[key])
	if err != nil {
		return 0, err
	}
	if n, err = AddCounter(key, n, delta); err != nil {
		return 0, err
	}
	if err := m.putLocked(key, strconv.AppendInt(nil, n, 10)); err != nil {
		return 0, err
	}
	m.notifyLocked()
	return n, nil
}

// ErrCounterOverflow is wrapped by Add when the sum would leave int64
// (it wrapped around silently).
var ErrCounterOverflow = errors.New("rendezvous: counter overflow")

// AddCounter returns n+delta, or an error wrapping ErrCounterOverflow
// naming key when the sum leaves int64. Every Store's Add uses it.
func AddCounter(key string, n, delta int64) (int64, error) {
	if delta > 0 && n > math.MaxInt64-delta || delta < 0 && n < math.MinInt64-delta {
		return 0, fmt.Errorf("%w: counter %q at %d plus %d leaves int64", ErrCounterOverflow, key, n, delta)
	}
	return n + delta, nil
}

// parseCounter reads a counter value: absent is 0, otherwise decimal text
// (Add stores counters as decimal so Get shows them readably).
func parseCounter(key string, v []byte) (int64, error) {
	if v == nil {
		return 0, nil
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("rendezvous: add to key %q: value %.32q is not a decimal integer", key, v)
	}
	return n, nil
}

func (m *memStore) CompareAndSet(ctx context.Context, key string, old, new []byte) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, false, ErrClosed
	}
	cur, ok := m.data[key]
	if (old == nil && ok) || (old != nil && (!ok || !bytes.Equal(cur, old))) {
		if !ok {
			return nil, false, nil
		}
		return present(cur), false, nil
	}
	if err := m.putLocked(key, present(new)); err != nil {
		return nil, false, err
	}
	m.notifyLocked()
	return present(new), true, nil
}

func (m *memStore) Delete(ctx context.Context, key string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false, ErrClosed
	}
	v, ok := m.data[key]
	delete(m.data, key)
	if ok {
		m.size -= int64(len(key) + len(v))
		m.notifyLocked()
	}
	return ok, nil
}

func (m *memStore) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		m.notifyLocked()
	}
	return nil
}

// present copies v into a non-nil slice: a nil value always means "absent",
// so a stored empty value must come back as []byte{}.
func present(v []byte) []byte { return append([]byte{}, v...) }
