package host

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// envPatient, set in a child rank's environment, makes its blocked waits
// sleep until woken (see patience).
const envPatient = "COLLGEN_HOST_PATIENT"

// patience replaces blockSlice and liveness in tests that must catch a
// lost wake-up: a waiter that nobody wakes sleeps until its collective's
// timeout and fails with ErrTimeout, instead of finding the arrival on
// its own a few milliseconds late.
const patience = time.Hour

// patientWaits lengthens the self-wake intervals until the test ends.
func patientWaits(t *testing.T) {
	bs, lv := blockSlice, liveness
	blockSlice, liveness = patience, patience
	t.Cleanup(func() { blockSlice, liveness = bs, lv })
}

// awaitSleeper polls g's view of rank waiter's flag lines until one says
// waiter is blocked in the kernel on rank on's counter; false if that did
// not happen within limit.
func awaitSleeper(g *Group, waiter, on int, limit time.Duration) bool {
	m := g.mems[waiter]
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(20 * time.Microsecond) {
		for s := 0; s < g.lay.Slots; s++ {
			for l := 0; l < g.lay.Lanes; l++ {
				if atomic.LoadUint64(word(m, g.lay.lineOff(s, l)+lineSleeper)) == uint64(on)+1 {
					return true
				}
			}
		}
	}
	return false
}

// holdBack returns a test hook under which rank 1 stops at the start of
// each collective's phase 0 until rank 0 is blocked in the kernel on rank
// 1's counter, so that rank 0 can only finish if rank 1's arrival wakes
// it. unseen counts the times rank 0 never blocked (the test would then
// prove nothing). group returns rank 1's group. The collectives run on
// slot 0, lane 0.
func holdBack(group func() *Group, unseen *atomic.Int32) func(rank int, point string) {
	return func(rank int, point string) {
		if rank != 1 || point != "phase:0" {
			return
		}
		// Nobody waits at a collective's last barrier, so rank 0 may still
		// be leaving its wait of the previous collective (its sleeper word
		// still set). Once rank 0 has arrived at this collective's first
		// barrier, a sleeper word it sets is for this one.
		g := group()
		line := g.lay.lineOff(0, 0)
		first := atomic.LoadUint64(word(g.mems[1], line+lineCounter)) + 1
		arrived := func() bool { return atomic.LoadUint64(word(g.mems[0], line+lineCounter)) >= first }
		for end := time.Now().Add(10 * time.Second); !arrived() && time.Now().Before(end); {
			time.Sleep(20 * time.Microsecond)
		}
		if !arrived() || !awaitSleeper(g, 0, 1, 10*time.Second) {
			unseen.Add(1)
		}
	}
}

// wakeOps is what TestBlockedWaiterIsWoken runs: one-shot all-reduces
// (phase 0 ends in the barrier where rank 0 waits for rank 1).
func wakeOps() []op {
	var ops []op
	for i := 0; i < 10; i++ {
		ops = append(ops, op{coll: coll.AllReduce, alg: coll.OneShot, dtype: "f32", red: "sum", count: 1000 + i, seed: i})
	}
	return ops
}

// wakeRun is the "wake" child mode: rank 1 holds rank 0 back as in
// holdBack, across processes.
func wakeRun(g *Group) error {
	var unseen atomic.Int32
	if g.Rank() == 1 {
		testHook = holdBack(func() *Group { return g }, &unseen)
	}
	for _, o := range wakeOps() {
		if _, err := runOp(context.Background(), g, o); err != nil {
			return err
		}
	}
	if n := unseen.Load(); n > 0 {
		return fmt.Errorf("rank 0 never blocked on rank 1 in %d collectives", n)
	}
	return nil
}

// TestBlockedWaiterIsWoken checks the wake-up protocol: rank 0 blocks on
// rank 1's counter at every collective, with no self-wake before the
// timeout, and rank 1's arrival must wake it. A lost wake-up fails the
// collective with ErrTimeout. Goroutine ranks on plain memory (parked in
// the Go scheduler) and on POSIX segments (futex), and process ranks
// (futex on a read-only mapping of the peer's segment).
func TestBlockedWaiterIsWoken(t *testing.T) {
	patientWaits(t)
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("goroutines/shared=%v", shared), func(t *testing.T) {
			var mu sync.Mutex
			groups := make([]*Group, 2)
			var unseen atomic.Int32
			testHook = holdBack(func() *Group { mu.Lock(); defer mu.Unlock(); return groups[1] }, &unseen)
			defer func() { testHook = nil }()
			errs := goroutineGroup(t, 2, Config{Shared: shared, Group: uniqueGroup(t), Timeout: 5 * time.Second}, func(g *Group) error {
				mu.Lock()
				groups[g.Rank()] = g
				mu.Unlock()
				for _, o := range wakeOps() {
					if _, err := runOp(context.Background(), g, o); err != nil {
						return err
					}
				}
				// Rank 0 blocked on rank 1 in every collective, so its
				// stats must say so.
				if st := g.WaitStats(); g.Rank() == 0 && st.Blocked < uint64(len(wakeOps())) {
					return fmt.Errorf("rank 0's WaitStats %+v: want Blocked >= %d", st, len(wakeOps()))
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			if n := unseen.Load(); n > 0 {
				t.Fatalf("rank 0 never blocked on rank 1 in %d collectives", n)
			}
		})
	}
	t.Run("processes", func(t *testing.T) {
		group := uniqueGroup(t)
		patient := func(int) []string { return []string{envPatient + "=1"} }
		for _, r := range startChildren(t, "wake", group, 2, 5*time.Second, patient) {
			if r.err != nil || r.stderr != "ok" {
				t.Errorf("rank %d: %v: %s", r.rank, r.err, r.stderr)
			}
		}
	})
}

// TestOversubscribedRanks runs the dtype x op x algorithm sweep, multi-lane
// pieces included, on more ranks than CPUs: 8 goroutine ranks on 2 Ps, and
// 8 process ranks (more than the CPUs of a small CI machine), with waits
// that only a peer's wake-up ends. Waiters spin, yield and block in turn
// while their peers need the CPUs; every result is checked.
func TestOversubscribedRanks(t *testing.T) {
	const w = 8
	t.Run("goroutines", func(t *testing.T) {
		patientWaits(t)
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
		runOps(t, w, Config{Lanes: 2, SlotBytes: 2 * 8192}, sweep([]int{1, 7, 1000, 5000}, w))
	})
	t.Run("processes", func(t *testing.T) {
		group := uniqueGroup(t)
		patient := func(int) []string { return []string{envPatient + "=1"} }
		for _, r := range startChildren(t, "sweep", group, w, 30*time.Second, patient) {
			if r.err != nil || r.stderr != "ok" {
				t.Errorf("rank %d: %v: %s", r.rank, r.err, r.stderr)
			}
		}
		if l := leftovers(t, group, w); len(l) > 0 {
			t.Errorf("left in /dev/shm: %v", l)
		}
	})
}

// BenchmarkAllReduce times f32 sum all-reduces on goroutine ranks (b.N per
// rank, set-up excluded) sharing ordinary memory, for profiling the
// per-call path:
//
//	go test -run '^$' -bench AllReduce -cpuprofile cpu.out ./runtime/host
func BenchmarkAllReduce(b *testing.B) { benchAllReduce(b, false) }

// BenchmarkAllReducePOSIX is BenchmarkAllReduce on POSIX segments
// (Config.Shared), the memory process ranks use: 4 KiB pages of tmpfs, so
// the footprint of the slots shows in TLB and cache misses.
func BenchmarkAllReducePOSIX(b *testing.B) { benchAllReduce(b, true) }

func benchAllReduce(b *testing.B, shared bool) {
	for _, w := range []int{1, 2, 4} {
		for _, size := range []int{4 << 10, 256 << 10, 1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("w%d/%dKiB", w, size>>10), func(b *testing.B) {
				st := rendezvous.NewMemStore()
				defer st.Close()
				var ready, done sync.WaitGroup
				start := make(chan struct{})
				errs := make([]error, w)
				for r := 0; r < w; r++ {
					ready.Add(1)
					done.Add(1)
					go func() {
						defer done.Done()
						g, err := New(context.Background(), Config{Rank: r, WorldSize: w, Store: st, Group: b.Name(), Library: testLibrary, Shared: shared})
						if err == nil {
							defer g.Close()
							err = g.Setup(context.Background())
						}
						ready.Done()
						<-start
						in, out := make([]byte, size), make([]byte, size)
						for i := 0; i < b.N && err == nil; i++ {
							err = g.AllReduce(context.Background(), in, out, size/4, "f32", "sum", Options{})
						}
						errs[r] = err
					}()
				}
				ready.Wait()
				b.SetBytes(int64(size))
				b.ResetTimer()
				close(start)
				done.Wait()
				if err := firstErr(errs); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// TestAreaReuseWaitsForReaders runs collectives back to back on one slot
// and lane, where nobody waits at a collective's last barrier, while rank 1
// dawdles at the start of every phase that reads its peers' Stage or
// Scratch. Ranks 0 and 2 return first and start the next collective at
// once; only the reuse rule (lane: small collectives on the halves of the
// area in turn, others waiting at the start for the readers of the piece
// before) keeps them from overwriting memory under rank 1's reads, which
// would make rank 1's result wrong. The sequence mixes collectives that use
// half the area (one piece) with ones that need all of it (several pieces),
// in every order.
func TestAreaReuseWaitsForReaders(t *testing.T) {
	testHook = func(rank int, point string) {
		if rank == 1 && (point == "phase:1" || point == "phase:2") {
			time.Sleep(3 * time.Millisecond)
		}
	}
	defer func() { testHook = nil }()
	small := func(c coll.Collective, alg coll.Algorithm, seed int) op {
		return op{coll: c, alg: alg, dtype: "f32", red: "sum", count: 100, seed: seed}
	}
	large := func(c coll.Collective, alg coll.Algorithm, seed int) op {
		return op{coll: c, alg: alg, dtype: "f32", red: "sum", count: 3000, seed: seed}
	}
	ops := []op{
		small(coll.AllReduce, coll.OneShot, 1), small(coll.AllReduce, coll.TwoShot, 2), small(coll.AllReduce, coll.OneShot, 3),
		large(coll.AllReduce, coll.TwoShot, 4), small(coll.AllReduce, coll.OneShot, 5), large(coll.AllReduce, coll.OneShot, 6),
		large(coll.AllReduce, coll.TwoShot, 7), small(coll.ReduceScatter, coll.OneShot, 8), small(coll.AllGather, coll.OneShot, 9),
		large(coll.AllGather, coll.OneShot, 10), large(coll.ReduceScatter, coll.OneShot, 11), small(coll.AllReduce, coll.TwoShot, 12),
	}
	errs := goroutineGroup(t, 3, Config{Slots: 1, Lanes: 1, SlotBytes: 4096, Group: uniqueGroup(t)}, func(g *Group) error {
		halves := map[bool]int{}
		for _, o := range ops {
			if _, err := runOp(context.Background(), g, o); err != nil {
				return err
			}
			x, err := planOf(g, o.coll, o.alg, o.count, o.dtype)
			if err != nil {
				return err
			}
			halves[x.halves]++
		}
		if halves[true] == 0 || halves[false] == 0 {
			return fmt.Errorf("collectives on half the area: %d, on all of it: %d; the test needs both", halves[true], halves[false])
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestBlockedWaitHonoursCancel cancels the context of a collective whose
// peer never comes, well inside the group's timeout: the blocked waiter
// must give up with the context's error, not the timeout.
func TestBlockedWaitHonoursCancel(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			release := make(chan struct{})
			var got error
			errs := goroutineGroup(t, 2, Config{Shared: shared, Group: uniqueGroup(t), Timeout: time.Minute}, func(g *Group) error {
				if err := g.Setup(context.Background()); err != nil {
					return err
				}
				if g.Rank() == 1 {
					<-release // never joins the collective
					return nil
				}
				defer close(release)
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(50*time.Millisecond, cancel)
				got = g.AllReduce(ctx, make([]byte, 64), make([]byte, 64), 16, "f32", "sum", Options{})
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(got, context.Canceled) {
				t.Fatalf("got %v, want context.Canceled", got)
			}
		})
	}
}
