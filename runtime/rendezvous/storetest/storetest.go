// Package storetest is the conformance suite every rendezvous.Store
// implementation passes: the in-memory, file and TCP stores in package
// rendezvous, and the etcd store in rendezvous/etcdstore. A new store calls
// Run from its tests.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// Setup prepares one fresh store for a subtest and returns newPeer, which
// returns another handle on that same store (as another process would
// open it). Handles are closed by the test's cleanup; closing one twice
// must be harmless.
type Setup func(t *testing.T) (newPeer func() rendezvous.Store)

// Run runs every conformance test on the store that setup makes.
func Run(t *testing.T, setup Setup) {
	t.Run("Ops", func(t *testing.T) { testOps(t, setup) })
	t.Run("WaitTimeoutNamesMissingKeys", func(t *testing.T) { testWaitTimeout(t, setup) })
	t.Run("ConcurrentAdd", func(t *testing.T) { testConcurrentAdd(t, setup) })
	t.Run("ConcurrentDelete", func(t *testing.T) { testConcurrentDelete(t, setup) })
	t.Run("Closed", func(t *testing.T) { testClosed(t, setup) })
	t.Run("CancelledWaitSaysWhy", func(t *testing.T) { testCancelledWait(t, setup) })
}

func short(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func testOps(t *testing.T, setup Setup) {
	peer := setup(t)
	a, b := peer(), peer()
	ctx := short(t, 5*time.Second)

	if err := a.Set(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Get(ctx, "k"); err != nil || string(v) != "v1" {
		t.Fatalf("Get = %q, %v; want v1", v, err)
	}
	if err := a.Set(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Get(ctx, "empty"); err != nil || v == nil || len(v) != 0 {
		t.Fatalf("Get(empty) = %#v, %v; want a non-nil empty value", v, err)
	}

	// Add: missing counts as 0, stored as decimal.
	for i, want := range []int64{5, 3} {
		n, err := []rendezvous.Store{a, b}[i].Add(ctx, "ctr", []int64{5, -2}[i])
		if err != nil || n != want {
			t.Fatalf("Add #%d = %d, %v; want %d", i, n, err, want)
		}
	}
	if v, _ := a.Get(ctx, "ctr"); string(v) != "3" {
		t.Fatalf("counter value = %q, want 3", v)
	}
	if _, err := a.Add(ctx, "k", 1); err == nil || err.Error() != `rendezvous: add to key "k": value "v1" is not a decimal integer` {
		t.Fatalf("Add to non-counter: %v", err)
	}
	// Add past int64 is an error that leaves the counter as it was (it
	// wrapped to MinInt64).
	if n, err := a.Add(ctx, "big", math.MaxInt64); err != nil || n != math.MaxInt64 {
		t.Fatalf("Add(MaxInt64) = %d, %v", n, err)
	}
	if n, err := b.Add(ctx, "big", 1); err == nil || !strings.Contains(err.Error(), "counter overflow") {
		t.Fatalf("Add past int64 = %d, %v; want a counter overflow error", n, err)
	}
	if v, _ := a.Get(ctx, "big"); string(v) != strconv.FormatInt(math.MaxInt64, 10) {
		t.Fatalf("counter after a refused Add = %q", v)
	}

	// CAS.
	cur, ok, err := a.CompareAndSet(ctx, "cas", nil, []byte("x"))
	if err != nil || !ok || string(cur) != "x" {
		t.Fatalf("CAS(absent→x) = %q, %v, %v", cur, ok, err)
	}
	cur, ok, err = b.CompareAndSet(ctx, "cas", nil, []byte("y"))
	if err != nil || ok || string(cur) != "x" {
		t.Fatalf("CAS(absent→y) on present = %q, %v, %v; want x, false", cur, ok, err)
	}
	cur, ok, err = b.CompareAndSet(ctx, "cas", []byte("x"), []byte("y"))
	if err != nil || !ok || string(cur) != "y" {
		t.Fatalf("CAS(x→y) = %q, %v, %v", cur, ok, err)
	}
	cur, ok, err = b.CompareAndSet(ctx, "nope", []byte("x"), []byte("y"))
	if err != nil || ok || cur != nil {
		t.Fatalf("CAS on absent key = %#v, %v, %v; want nil, false", cur, ok, err)
	}
	// An empty old value matches a present empty value, not an absent key.
	if cur, ok, err = a.CompareAndSet(ctx, "empty", []byte{}, []byte("e")); err != nil || !ok || string(cur) != "e" {
		t.Fatalf("CAS(empty→e) = %q, %v, %v", cur, ok, err)
	}
	if cur, ok, err = a.CompareAndSet(ctx, "absent", []byte{}, []byte("e")); err != nil || ok || cur != nil {
		t.Fatalf("CAS(empty→e) on absent key = %#v, %v, %v; want nil, false", cur, ok, err)
	}

	// Delete.
	if ok, err := a.Delete(ctx, "cas"); err != nil || !ok {
		t.Fatalf("Delete existing = %v, %v", ok, err)
	}
	if ok, err := b.Delete(ctx, "cas"); err != nil || ok {
		t.Fatalf("Delete missing = %v, %v", ok, err)
	}

	// Wait wakes when another handle sets the key.
	go func() {
		time.Sleep(20 * time.Millisecond)
		b.Set(ctx, "late", []byte("1"))
	}()
	if err := a.Wait(short(t, 3*time.Second), "k", "late"); err != nil {
		t.Fatal(err)
	}
	// Long keys still work (file store hashes them).
	long := string(bytes.Repeat([]byte("x"), 400))
	if err := a.Set(ctx, long, []byte("L")); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Get(ctx, long); err != nil || string(v) != "L" {
		t.Fatalf("long key: %q, %v", v, err)
	}
}

func testWaitTimeout(t *testing.T, setup Setup) {
	s := setup(t)()
	s.Set(context.Background(), "b", []byte("1"))
	start := time.Now()
	err := s.Wait(short(t, 100*time.Millisecond), "a", "b", "c")
	if got, want := fmt.Sprint(err), `rendezvous: timeout waiting for keys "a", "c"`; got != want {
		t.Fatalf("Wait error = %q, want %q", got, want)
	}
	if !errors.Is(err, rendezvous.ErrTimeout) {
		t.Fatal("error does not wrap ErrTimeout")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Wait took %v", d)
	}
	_, err = s.Get(short(t, 50*time.Millisecond), "zz")
	if got, want := fmt.Sprint(err), `rendezvous: timeout waiting for key "zz"`; got != want {
		t.Fatalf("Get error = %q, want %q", got, want)
	}
}

func testConcurrentAdd(t *testing.T, setup Setup) {
	peer := setup(t)
	const workers, each = 4, 25
	var wg sync.WaitGroup
	for range workers {
		s := peer()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, err := s.Add(short(t, 5*time.Second), "n", 1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	n, err := peer().Add(context.Background(), "n", 0)
	if err != nil || n != workers*each {
		t.Fatalf("counter = %d, %v; want %d", n, err, workers*each)
	}
}

// testConcurrentDelete: Deletes of the same keys at once, through one
// handle and another (as rendezvous.DeleteKeys and a peer's may run),
// each report the key as existing exactly once, and the keys are gone;
// DeleteKeys deletes them again, and then finds them gone without an
// error.
func testConcurrentDelete(t *testing.T, setup Setup) {
	peer := setup(t)
	handles := []rendezvous.Store{peer(), peer()}
	ctx := short(t, 20*time.Second)
	const n, each = 24, 3 // each key deleted 3 times on each handle
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "del/" + strconv.Itoa(i)
		if err := handles[0].Set(ctx, keys[i], []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	existed := map[string]int{}
	var wg sync.WaitGroup
	for _, s := range handles {
		for range each {
			for _, k := range keys {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ok, err := s.Delete(ctx, k)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						mu.Lock()
						existed[k]++
						mu.Unlock()
					}
				}()
			}
		}
	}
	wg.Wait()
	for _, k := range keys {
		if existed[k] != 1 {
			t.Errorf("%d concurrent Deletes of %q said it existed, want 1", existed[k], k)
		}
		// Absent: creating it again swaps.
		if _, swapped, err := handles[1].CompareAndSet(ctx, k, nil, []byte("w")); err != nil || !swapped {
			t.Fatalf("%q after its Deletes: create swapped %v, %v; want the key gone", k, swapped, err)
		}
	}
	for range 2 { // the second finds every key gone: no error
		if err := rendezvous.DeleteKeys(ctx, handles[1], keys...); err != nil {
			t.Fatalf("DeleteKeys: %v", err)
		}
	}
	if n, err := handles[0].Add(ctx, "del/0", 0); err != nil || n != 0 {
		t.Fatalf("Add to a deleted key = %d, %v; want 0 (the key gone)", n, err)
	}
}

// testClosed: operations on a closed store return ErrClosed, and a second
// Close is harmless (rendezvous.Store's contract).
func testClosed(t *testing.T, setup Setup) {
	s := setup(t)()
	s.Close()
	if err := s.Set(context.Background(), "k", nil); !errors.Is(err, rendezvous.ErrClosed) {
		t.Fatalf("Set after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v, want nil", err)
	}
}

// testCancelledWait: a wait cancelled with a cause (a signal, via
// signal.NotifyContext, or the caller's own) names it, and is still
// context.Canceled for errors.Is.
func testCancelledWait(t *testing.T, setup Setup) {
	s := setup(t)()
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		time.Sleep(20 * time.Millisecond)
		cancel(errors.New("terminated signal received"))
	}()
	err := s.Wait(ctx, "never")
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "terminated signal received") {
		t.Fatalf("Wait = %v, want context.Canceled naming the cause", err)
	}
}
