package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// runRanks runs fn for ranks 0..world-1 concurrently, each with its own
// store handle, and returns their errors by rank.
func runRanks(world int, peer func() Store, fn func(rank int, s Store) error) []error {
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		s := peer()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r, s)
		}()
	}
	wg.Wait()
	return errs
}

func TestBarrierAndAllGatherReusable(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			peer := k.setup(t)
			const world, rounds = 4, 5
			errs := runRanks(world, peer, func(rank int, s Store) error {
				ctx := short(t, 10*time.Second)
				if err := Join(ctx, s, "g", rank, world); err != nil {
					return err
				}
				for round := range rounds {
					if err := Barrier(ctx, s, "b", rank, world); err != nil {
						return err
					}
					got, err := AllGather(ctx, s, "ag", rank, world, []byte(fmt.Sprintf("r%d-%d", rank, round)))
					if err != nil {
						return err
					}
					for i, b := range got {
						if want := fmt.Sprintf("r%d-%d", i, round); string(b) != want {
							return fmt.Errorf("round %d: blob %d = %q, want %q", round, i, b, want)
						}
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

func TestAllGatherKeepsAtMostTwoGenerations(t *testing.T) {
	s := NewMemStore().(*memStore)
	const world = 3
	runRanks(world, func() Store { return s }, func(rank int, st Store) error {
		for range 6 {
			if _, err := AllGather(short(t, 5*time.Second), st, "x", rank, world, []byte("b")); err != nil {
				return err
			}
		}
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	// world gen counters + at most two generations of world blobs.
	if n := len(s.data); n > world+2*world {
		t.Fatalf("store holds %d keys after 6 rounds: %v", n, s.data)
	}
}

func TestBarrierTimeoutNamesMissingRank(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			peer := k.setup(t)
			errs := runRanks(4, peer, func(rank int, s Store) error {
				if rank == 2 {
					return nil // never arrives
				}
				return Barrier(short(t, 300*time.Millisecond), s, "b", rank, 4)
			})
			for _, r := range []int{0, 1, 3} {
				if got, want := fmt.Sprint(errs[r]), "rendezvous: 3/4 ranks joined after 300ms; missing rank 2"; got != want {
					t.Errorf("rank %d: %q, want %q", r, got, want)
				}
				var mre *MissingRanksError
				if !errors.As(errs[r], &mre) || !errors.Is(errs[r], ErrTimeout) {
					t.Errorf("rank %d: %T is not a *MissingRanksError wrapping ErrTimeout", r, errs[r])
				}
			}
		})
	}
}

func TestJoinTimeoutNamesMissingRanks(t *testing.T) {
	s := NewMemStore()
	err := Join(short(t, 50*time.Millisecond), s, "g", 1, 4)
	if got, want := fmt.Sprint(err), "rendezvous: 1/4 ranks joined after 50ms; missing ranks 0, 2, 3"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestMissingRanksErrorText(t *testing.T) {
	e := &MissingRanksError{Joined: 3, World: 4, After: 30*time.Second - time.Millisecond, Missing: []int{2}}
	if got, want := e.Error(), "rendezvous: 3/4 ranks joined after 30s; missing rank 2"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestJoinWorldSizeMismatch(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			peer := k.setup(t)
			a, b := peer(), peer()
			first := make(chan error, 1)
			start := time.Now()
			go func() { first <- Join(short(t, 30*time.Second), a, "g", 0, 4) }()
			// Let rank 0 register the size first.
			if err := a.Wait(short(t, 2*time.Second), joinPrefix+"g/world"); err != nil {
				t.Fatal(err)
			}
			err := Join(short(t, time.Second), b, "g", 1, 3)
			want := `rendezvous: world size mismatch: group "g": rank 1 has world size 3 but the group was formed with world size 4; start every rank with the same world size`
			if fmt.Sprint(err) != want || !errors.Is(err, ErrWorldSizeMismatch) {
				t.Fatalf("got %v\nwant %s", err, want)
			}
			// Rank 0, already waiting, fails with the same error at once
			// rather than after its 30 s deadline.
			if err := <-first; fmt.Sprint(err) != want || !errors.Is(err, ErrWorldSizeMismatch) {
				t.Fatalf("rank 0: %v\nwant %s", err, want)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Fatalf("rank 0 learnt of the mismatch after %v", d)
			}
		})
	}
}

func TestJoinDuplicateRank(t *testing.T) {
	for _, k := range storeKinds() {
		t.Run(k.name, func(t *testing.T) {
			peer := k.setup(t)
			a, b := peer(), peer()
			done := make(chan error, 1)
			go func() { done <- Join(short(t, 2*time.Second), a, "g", 0, 2) }()
			// Wait until rank 0 registered, then try to join as rank 0 again.
			if err := a.Wait(short(t, 2*time.Second), joinPrefix+"g/rank/0"); err != nil {
				t.Fatal(err)
			}
			err := Join(short(t, time.Second), b, "g", 0, 2)
			want := `rendezvous: duplicate rank: group "g": rank 0 has already joined; give each process its own rank (or, when rerunning, a new run id: an earlier run with the same id on this store left its keys)`
			if fmt.Sprint(err) != want || !errors.Is(err, ErrDuplicateRank) {
				t.Fatalf("got %v\nwant %s", err, want)
			}
			if err := Join(short(t, time.Second), b, "g", 1, 2); err != nil {
				t.Fatalf("rank 1: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("rank 0: %v", err)
			}
		})
	}
}

func TestRankOutOfRange(t *testing.T) {
	s := NewMemStore()
	for _, tc := range []struct {
		rank, world int
		want        string
	}{
		{4, 4, "rendezvous: rank 4 is out of range for world size 4 (want 0..3)"},
		{-1, 2, "rendezvous: rank -1 is out of range for world size 2 (want 0..1)"},
		{0, 0, "rendezvous: world size 0: want at least 1"},
	} {
		if err := Barrier(context.Background(), s, "b", tc.rank, tc.world); fmt.Sprint(err) != tc.want {
			t.Errorf("Barrier(rank %d, world %d) = %v, want %s", tc.rank, tc.world, err, tc.want)
		}
	}
}

func TestFileStoreAcrossHandlesCAS(t *testing.T) {
	// Many handles (as separate processes would have) race to CAS one key;
	// exactly one must win.
	dir := t.TempDir()
	var wins sync.WaitGroup
	var mu sync.Mutex
	winners := 0
	for i := range 8 {
		s := openFileStore(t, dir)
		wins.Add(1)
		go func() {
			defer wins.Done()
			_, ok, err := s.CompareAndSet(context.Background(), "leader", nil, []byte(strconv.Itoa(i)))
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				winners++
				mu.Unlock()
			}
		}()
	}
	wins.Wait()
	if winners != 1 {
		t.Fatalf("%d CAS winners, want 1", winners)
	}
}

func TestRoundWait(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{
		299400 * time.Microsecond:            300 * time.Millisecond,
		300 * time.Millisecond:               300 * time.Millisecond,
		30*time.Second - 3*time.Millisecond:  30 * time.Second,
		4200 * time.Microsecond:              5 * time.Millisecond,
		DefaultTimeout - 20*time.Millisecond: DefaultTimeout,
	} {
		if got := roundWait(in); got != want {
			t.Errorf("roundWait(%v) = %v, want %v", in, got, want)
		}
	}
}

// ForgetAllGather and ForgetBarrier delete every key the name kept (a
// generation counter and the last entry per rank), and nothing else.
func TestForgetGather(t *testing.T) {
	s := NewMemStore().(*memStore)
	ctx := context.Background()
	if err := s.Set(ctx, "other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	const world = 3
	for i := 0; i < 3; i++ {
		errs := make([]error, world)
		var wg sync.WaitGroup
		for r := 0; r < world; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := AllGather(ctx, s, "g", r, world, []byte{byte(r)}); err != nil {
					errs[r] = err
					return
				}
				errs[r] = Barrier(ctx, s, "b", r, world)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := ForgetAllGather(ctx, s, "g", world); err != nil {
		t.Fatal(err)
	}
	if err := ForgetBarrier(ctx, s, "b", world); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.data) != 1 || s.data["other"] == nil {
		t.Errorf("keys left: %q", slices.Collect(maps.Keys(s.data)))
	}
}

// A nil store given to the collectives, or a world size below 1 given to
// the Forget functions, is an error wrapping ErrInvalidArgument that names
// the function and the argument, not a panic.
func TestCollectivesInvalidArgument(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	for _, tc := range []struct {
		want string
		call func() error
	}{
		{"Join: the store is nil", func() error { return Join(ctx, nil, "g", 0, 1) }},
		{"Barrier: the store is nil", func() error { return Barrier(ctx, nil, "b", 0, 1) }},
		{"AllGather: the store is nil", func() error {
			out, err := AllGather(ctx, nil, "ag", 0, 1, []byte("x"))
			if out != nil {
				t.Errorf("AllGather, nil store: out = %q, want nil", out)
			}
			return err
		}},
		{"ForgetAllGather: the store is nil", func() error { return ForgetAllGather(ctx, nil, "ag", 1) }},
		{"ForgetBarrier: the store is nil", func() error { return ForgetBarrier(ctx, nil, "b", 1) }},
		{"ForgetAllGather: world size -1: want at least 1", func() error { return ForgetAllGather(ctx, s, "ag", -1) }},
		{"Barrier: the store is a nil *rendezvous.memStore", func() error { var ms *memStore; return Barrier(ctx, ms, "b", 0, 1) }},
		{"Join: the store is a nil *rendezvous.memStore", func() error { var ms *memStore; return Join(ctx, ms, "g", 0, 1) }},
		{"ForgetBarrier: world size 0: want at least 1", func() error { return ForgetBarrier(ctx, s, "b", 0) }},
	} {
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			err = tc.call()
		}()
		if want := "rendezvous: invalid argument: " + tc.want; !errors.Is(err, ErrInvalidArgument) || err.Error() != want {
			t.Errorf("got %v; want ErrInvalidArgument reading %q", err, want)
		}
	}
}

// TestRankErrorsInvalidArgument: a rank out of range or a world size below
// 1, refused by Join, Barrier, AllGather and FromEnv's checks, matches
// ErrInvalidArgument too, its text unchanged.
func TestRankErrorsInvalidArgument(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	for _, tc := range []struct {
		want string
		call func() error
	}{
		{"rendezvous: rank 2 is out of range for world size 2 (want 0..1)", func() error { return Barrier(ctx, s, "b", 2, 2) }},
		{"rendezvous: rank -1 is out of range for world size 3 (want 0..2)", func() error { return Join(ctx, s, "j", -1, 3) }},
		{"rendezvous: world size 0: want at least 1", func() error { _, err := AllGather(ctx, s, "ag", 0, 0, nil); return err }},
	} {
		if err := tc.call(); !errors.Is(err, ErrInvalidArgument) || err.Error() != tc.want {
			t.Errorf("got %v; want ErrInvalidArgument reading %q", err, tc.want)
		}
	}
}
