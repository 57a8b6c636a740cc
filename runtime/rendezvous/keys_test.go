package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// slowDeletes is a store whose Delete takes delay (or until ctx ends) and
// counts the Deletes in flight: now, the most at once, and all calls.
// fail makes a key's Delete fail.
type slowDeletes struct {
	Store
	delay time.Duration
	fail  map[string]error
	// started, when set, receives every Delete's key as it starts.
	started chan string

	mu                sync.Mutex
	now, peak, called int
}

func (s *slowDeletes) Delete(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	s.now++
	s.called++
	s.peak = max(s.peak, s.now)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.now--
		s.mu.Unlock()
	}()
	if s.started != nil {
		s.started <- key
	}
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	if err := s.fail[key]; err != nil {
		return false, err
	}
	return s.Store.Delete(ctx, key)
}

func (s *slowDeletes) counts() (now, peak, called int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now, s.peak, s.called
}

// setKeys sets n keys "k0" … and returns their names.
func setKeys(t *testing.T, s Store, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		if err := s.Set(context.Background(), keys[i], []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// DeleteKeys keeps KeysInFlight Deletes in flight, no more: 100 keys of
// 20ms each go in about 7 rounds, not 100 (one per key, in a row, made
// closing a group on etcd at world 64 take hundreds of round trips).
// Keys already gone are no error, and nothing else is deleted.
func TestDeleteKeysConcurrent(t *testing.T) {
	mem := NewMemStore().(*memStore)
	s := &slowDeletes{Store: mem, delay: 20 * time.Millisecond}
	keys := setKeys(t, mem, 100)
	mem.Set(context.Background(), "other", []byte("x"))
	start := time.Now()
	if err := DeleteKeys(context.Background(), s, append(keys, "gone", "k0")...); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	now, peak, called := s.counts()
	if peak != KeysInFlight || now != 0 || called != 102 {
		t.Fatalf("%d Deletes at most in flight, %d still in flight, %d called; want %d, 0, 102", peak, now, called, KeysInFlight)
	}
	if took > time.Second { // one at a time: 2s
		t.Errorf("100 keys of 20ms took %v", took)
	}
	mem.mu.Lock()
	defer mem.mu.Unlock()
	if len(mem.data) != 1 || mem.data["other"] == nil {
		t.Errorf("keys left: %d, want only \"other\"", len(mem.data))
	}
}

// A Delete that fails does not stop the others; the error names the
// first key that failed, in the order given, wraps its error and counts
// the rest.
func TestDeleteKeysErrors(t *testing.T) {
	mem := NewMemStore()
	e3, e7 := errors.New("fake: k3 refused"), errors.New("fake: k7 refused")
	s := &slowDeletes{Store: mem, fail: map[string]error{"k7": e7, "k3": e3}}
	keys := setKeys(t, mem, 40)
	err := DeleteKeys(context.Background(), s, keys...)
	if !errors.Is(err, e3) || err.Error() != `rendezvous: delete "k3": fake: k3 refused (and 1 more of 40 keys failed)` {
		t.Fatalf("err = %v; want k3's, naming it, and one more", err)
	}
	m := mem.(*memStore)
	m.mu.Lock()
	for _, k := range keys {
		if _, present := m.data[k]; present != (k == "k3" || k == "k7") {
			t.Errorf("key %s present %v after DeleteKeys", k, present)
		}
	}
	m.mu.Unlock()
	// One failure: no count. A store error naming the key is not
	// wrapped with it again.
	s.fail = map[string]error{"k3": fmt.Errorf(`store: delete "k3": %w`, e3)}
	err = DeleteKeys(context.Background(), s, "k3", "k7")
	if !errors.Is(err, e3) || err.Error() != `store: delete "k3": fake: k3 refused` {
		t.Fatalf("err = %v", err)
	}
	if err := DeleteKeys(context.Background(), nil, "k"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil store: %v, want ErrInvalidArgument", err)
	}
	if _, err := Counters(context.Background(), nil, "k"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Counters, nil store: %v, want ErrInvalidArgument", err)
	}
}

// A ctx cancelled while Deletes are in flight ends them, starts no more,
// and DeleteKeys returns only once every Delete it started has returned
// (no goroutine left behind), with the cancellation's error. A ctx done
// before the call starts none.
func TestDeleteKeysCancelled(t *testing.T) {
	mem := NewMemStore()
	keys := setKeys(t, mem, 100)
	s := &slowDeletes{Store: mem, delay: time.Hour, started: make(chan string, 100)}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- DeleteKeys(ctx, s, keys...) }()
	for i := range KeysInFlight {
		select {
		case <-s.started:
		case <-time.After(5 * time.Second):
			cancel(errors.New("fake: test failed"))
			<-done
			t.Fatalf("only %d Deletes started at once, want %d", i, KeysInFlight)
		}
	}
	cancel(errors.New("fake: shutting down"))
	err := <-done
	now, peak, called := s.counts()
	if now != 0 || peak != KeysInFlight || called != KeysInFlight {
		t.Fatalf("after DeleteKeys returned: %d Deletes in flight, at most %d, %d called; want 0, %d, %d", now, peak, called, KeysInFlight, KeysInFlight)
	}
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), `rendezvous: delete "k0": context canceled`) ||
		!strings.HasSuffix(err.Error(), "(and 99 more of 100 keys failed)") {
		t.Fatalf("err = %v; want context.Canceled for every key", err)
	}
	err = DeleteKeys(ctx, s, keys...)
	if _, _, called := s.counts(); called != KeysInFlight || !errors.Is(err, context.Canceled) ||
		!strings.Contains(err.Error(), "fake: shutting down") {
		t.Fatalf("done ctx: %d Deletes called, %v; want none, and the cause", called-KeysInFlight, err)
	}
}

// Counters reads counters KeysInFlight at a time; a missing one reads 0
// (and is created, as Add creates it).
func TestCounters(t *testing.T) {
	s := NewMemStore()
	ctx := context.Background()
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprint("c", i)
		if i%2 == 1 {
			s.Add(ctx, keys[i], int64(i))
		}
	}
	got, err := Counters(ctx, s, keys...)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range got {
		if want := int64(i % 2 * i); n != want {
			t.Errorf("%s = %d, want %d", keys[i], n, want)
		}
	}
	s.Set(ctx, "text", []byte("x"))
	got, err = Counters(ctx, s, "c1", "text")
	if err == nil || !strings.Contains(err.Error(), `"text"`) || got[0] != 1 || got[1] != 0 {
		t.Fatalf("Counters of a text value: %v, %v; want c1's and an error naming the key", got, err)
	}
}
