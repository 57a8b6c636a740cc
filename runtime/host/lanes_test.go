package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// laneOps is every dtype x op x algorithm at counts that leave lanes idle
// (fewer pieces than lanes), split pieces unevenly over lanes and end on a
// partial piece, with lane areas of 4 KiB: 1024 f32 elements per one-shot
// piece, 512 per two-shot piece (Stage and Scratch share the area).
func laneOps(w int) []op {
	return sweep([]int{1, 13, 1500, 3001, 6007}, w)
}

// TestLanesMatchOneLane runs laneOps on two groups of the same goroutine
// ranks with the same piece geometry (4 KiB lane areas; pieces are then
// as large as a Stage, whatever the lane count): one of 4 lanes, whose
// lanes the callers and the helpers claim as they come, and one of a
// single lane, where the caller runs every piece in order. Each result
// is checked against the float64 reference (runOp), all-reduce results
// must be bitwise equal on every rank, and each rank's results bitwise
// equal in both groups: lanes change who runs a piece, never the
// arithmetic.
func TestLanesMatchOneLane(t *testing.T) {
	worlds := []int{2, 3, 4}
	if testing.Short() {
		worlds = []int{3}
	}
	for _, w := range worlds {
		t.Run(fmt.Sprint("w", w), func(t *testing.T) {
			ops := laneOps(w)
			st := rendezvous.NewMemStore()
			defer st.Close()
			base := Config{Store: st, Library: testLibrary, Timeout: 20 * time.Second}
			multi, single := base, base
			multi.Group, multi.Lanes, multi.SlotBytes = t.Name()+"/4", 4, 4*4096
			single.Group, single.Lanes, single.SlotBytes = t.Name()+"/1", 1, 4096
			outs := make([][][]byte, w) // by rank: multi-lane all-reduce results
			errs := make([]error, w)
			var wg sync.WaitGroup
			for r := 0; r < w; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[r] = func() error {
						groups := make([]*Group, 2)
						for i, cfg := range []Config{multi, single} {
							cfg.Rank, cfg.WorldSize = r, w
							g, err := New(context.Background(), cfg)
							if err != nil {
								return err
							}
							defer g.Close()
							groups[i] = g
						}
						for _, o := range ops {
							got, err := runOp(context.Background(), groups[0], o)
							if err != nil {
								return err
							}
							want, err := runOp(context.Background(), groups[1], o)
							if err != nil {
								return err
							}
							if !bytes.Equal(got, want) {
								return fmt.Errorf("rank %d %v: 4 lanes and 1 lane differ", r, o)
							}
							if o.coll == coll.AllReduce {
								outs[r] = append(outs[r], got)
							}
						}
						return nil
					}()
				}()
			}
			wg.Wait()
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			sameOnEveryRank(t, outs)
		})
	}
}

// oneRank returns a set-up group of WorldSize 1 with lanes lanes of 4 KiB.
func oneRank(t *testing.T, lanes int) *Group {
	t.Helper()
	g, err := New(context.Background(), Config{Rank: 0, WorldSize: 1, Store: rendezvous.NewMemStore(), Group: t.Name(),
		Library: testLibrary, Lanes: lanes, SlotBytes: lanes * 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	return g
}

// helperGoroutines counts the goroutines running a group's helper loop
// (every group's: tests run one group at a time here).
func helperGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "host.(*Group).startHelpers.func")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestHelpersEndAtClose: a group of L lanes starts L-1 helpers with its
// shared memory (none for one lane), they serve multi-lane collectives,
// and Close ends them; calls after Close fail with ErrClosed. It also
// closes a group whose helpers were never offered a job and one with jobs
// queued while every helper was busy.
func TestHelpersEndAtClose(t *testing.T) {
	for _, lanes := range []int{1, 2, 4, 8} {
		g := oneRank(t, lanes)
		if n := helperGoroutines(); n != lanes-1 {
			t.Errorf("lanes %d: %d helpers after set-up, want %d", lanes, n, lanes-1)
		}
		for i := 0; i < 20 && lanes >= 4; i++ {
			o := op{coll: coll.AllReduce, alg: coll.TwoShot, dtype: coll.F32, red: coll.Sum, count: 7000 + i, seed: i}
			if lanes == 8 {
				o = op{coll: coll.AllGather, alg: coll.OneShot, dtype: coll.I32, count: 9000, seed: i}
			}
			if _, err := runOp(context.Background(), g, o); err != nil {
				t.Fatal(err)
			}
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		// A helper has signalled its end (Close waits for that) but may
		// still be on its way out for a moment.
		n := helperGoroutines()
		for end := time.Now().Add(5 * time.Second); n > 0 && time.Now().Before(end); n = helperGoroutines() {
			time.Sleep(time.Millisecond)
		}
		if n != 0 {
			t.Errorf("lanes %d: %d helpers left after Close", lanes, n)
		}
		b := make([]byte, 1<<16)
		if err := g.AllReduce(context.Background(), b, b, len(b)/4, coll.F32, coll.Sum, Options{}); !errors.Is(err, ErrClosed) {
			t.Errorf("lanes %d: call after Close: %v, want ErrClosed", lanes, err)
		}
	}
}

// TestMultiLaneCallsAllocateNothing: once set up, a collective split over
// several lanes (pieces handed to helpers) allocates nothing, like a
// single-lane one.
func TestMultiLaneCallsAllocateNothing(t *testing.T) {
	g := oneRank(t, 4)
	defer g.Close()
	const n = 20000 // f32: 20 pieces of 4 KiB
	in, out := make([]byte, 4*n), make([]byte, 4*n)
	numeric.Fill(coll.F32, in, 1, 0)
	calls := []struct {
		name string
		f    func() error
	}{
		{"all-reduce one-shot", func() error {
			return g.AllReduce(context.Background(), in, out, n, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
		}},
		{"all-reduce two-shot", func() error {
			return g.AllReduce(context.Background(), in, out, n, coll.BF16, coll.Max, Options{Algorithm: coll.TwoShot})
		}},
		{"reduce-scatter", func() error {
			return g.ReduceScatter(context.Background(), in, out, n, coll.I32, coll.Min, Options{})
		}},
		{"all-gather", func() error { return g.AllGather(context.Background(), in, out, n, coll.F32, Options{}) }},
	}
	defer func() {
		// One rank has no peer to wait for.
		if st := g.WaitStats(); st != (WaitStats{}) {
			t.Errorf("world 1 WaitStats %+v, want none", st)
		}
	}()
	for _, c := range calls {
		var err error
		allocs := testing.AllocsPerRun(50, func() {
			if e := c.f(); e != nil {
				err = e
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if allocs != 0 {
			t.Errorf("%s over 4 lanes: %v allocations per call, want 0", c.name, allocs)
		}
	}
}

// TestLanesOversubscribed runs laneOps on 4 goroutine ranks of 4 lanes
// each with GOMAXPROCS 1: sixteen lane runners, callers and helpers, on
// one P, with waits that only a peer's wake-up ends. Every result is
// checked; no timing is asserted.
func TestLanesOversubscribed(t *testing.T) {
	patientWaits(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const w = 4
	ops := laneOps(w)
	if testing.Short() {
		ops = ops[:len(ops)/4]
	}
	runOps(t, w, Config{Lanes: 4, SlotBytes: 4 * 4096}, ops)
}

// TestCPUsFollowGOMAXPROCS: the default lane count and the choice to spin
// count the CPUs Go may use at once when the group is made, the fewer of
// NumCPU and GOMAXPROCS (which Go lowers to a container's CPU quota):
// with one P, a rank gets one lane, and two process ranks do not spin.
func TestCPUsFollowGOMAXPROCS(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	// planned returns the plan of a 1000-element one-shot all-reduce on
	// rank 0 of a world-2 group of processes made now.
	planned := func() *exec {
		g, err := New(context.Background(), Config{Rank: 0, WorldSize: 2, Store: nopStore{}, Group: "cpus", Library: testLibrary, Shared: true})
		if err != nil {
			t.Fatal(err)
		}
		g.lay = layout{Slots: 1, Lanes: 1, LaneBytes: 4096}
		x, err := planOf(g, coll.AllReduce, coll.OneShot, 1000, coll.F32)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	one, err := New(context.Background(), Config{Rank: 0, WorldSize: 1, Store: nopStore{}, Group: "cpus", Library: testLibrary})
	if err != nil {
		t.Fatal(err)
	}
	if l := one.defaultLayout().Lanes; l != 1 {
		t.Errorf("GOMAXPROCS 1: %d lanes by default, want 1", l)
	}
	if x := planned(); x.spin {
		t.Error("2 process ranks, GOMAXPROCS 1: spin, want no spinning")
	}
	if runtime.NumCPU() >= 2 {
		runtime.GOMAXPROCS(2)
		if x := planned(); !x.spin {
			t.Errorf("2 process ranks, GOMAXPROCS 2 of %d CPUs: no spinning, want spinning", runtime.NumCPU())
		}
	}
}

// TestCallsRacingClose: collectives issued from several goroutines while
// another closes the group each either run or return ErrClosed, and Close
// returns once those in flight are done. Registering a call raced Close's
// wait for the calls in flight (a sync.WaitGroup's Add from zero during
// its Wait: the race detector's report, or at worst the WaitGroup's
// "misuse" panic); run it with -race.
func TestCallsRacingClose(t *testing.T) {
	for i := 0; i < 200; i++ {
		g := oneRank(t, 1)
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, 4)
		for k := 0; k < 4; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := make([]byte, 64)
				<-start
				for {
					err := g.AllReduce(context.Background(), b, b, len(b)/4, coll.F32, coll.Sum, Options{})
					if err != nil {
						if !errors.Is(err, ErrClosed) {
							errs <- err
						}
						return
					}
				}
			}()
		}
		close(start)
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("a call racing Close: %v, want nil or ErrClosed", err)
		}
	}
}
