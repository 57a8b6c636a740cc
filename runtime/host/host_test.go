package host

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/internal/meminfo"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestCorrectnessGoroutines runs every dtype x op x algorithm on sampled
// world sizes of the host spec (1..64) with tiny, odd and multi-piece
// counts, in and out of place, on goroutine ranks; all-reduce results must
// also be bitwise identical on every rank.
func TestCorrectnessGoroutines(t *testing.T) {
	worlds := []int{1, 2, 3, 4, 5, 8, 16, 33, 64}
	if testing.Short() {
		worlds = []int{1, 2, 3, 8}
	}
	for _, w := range worlds {
		t.Run(fmt.Sprint("w", w), func(t *testing.T) {
			counts := []int{1, 7, 3*w*16 + 5}
			if w <= 8 {
				// Several pieces over several lanes: slots of 3 lanes of 4 KiB.
				counts = append(counts, 5000)
			}
			ops := sweep(counts, w)
			outs := make([][][]byte, w)
			cfg := Config{Lanes: 3, SlotBytes: 3 * 4096}
			if w > 8 {
				cfg = Config{Lanes: 1, SlotBytes: 2 * w * 64}
			}
			errs := goroutineGroup(t, w, cfg, func(g *Group) error {
				for _, o := range ops {
					out, err := runOp(context.Background(), g, o)
					if err != nil {
						return err
					}
					if o.coll == coll.AllReduce {
						outs[g.Rank()] = append(outs[g.Rank()], out)
					}
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			sameOnEveryRank(t, outs)
		})
	}
}

// TestZeroCountAndErrors covers argument checking.
func TestZeroCountAndErrors(t *testing.T) {
	errs := goroutineGroup(t, 2, Config{}, func(g *Group) error {
		ctx := context.Background()
		if err := g.AllReduce(ctx, nil, nil, 0, "f32", "sum", Options{}); err != nil {
			return err
		}
		if err := g.AllReduce(ctx, make([]byte, 4), make([]byte, 4), 2, "f32", "sum", Options{}); err == nil {
			return errors.New("short buffers accepted")
		}
		if err := g.AllReduce(ctx, make([]byte, 8), make([]byte, 8), 2, "f17", "sum", Options{}); err == nil {
			return errors.New("bad dtype accepted")
		}
		if err := g.AllReduce(ctx, make([]byte, 8), make([]byte, 8), 2, "f32", "prod", Options{}); err == nil {
			return errors.New("bad op accepted")
		}
		if err := g.AllReduce(ctx, make([]byte, 8), make([]byte, 8), 2, "f32", "sum", Options{Algorithm: "hcm"}); err == nil {
			return errors.New("hcm accepted at world 2")
		}
		if err := g.AllReduce(ctx, make([]byte, 8), make([]byte, 8), 2, "f32", "sum", Options{Algorithm: "oneshot_ll"}); err == nil ||
			!strings.Contains(err.Error(), "host backend does not allow") {
			return fmt.Errorf("oneshot_ll on the host: got %v, want a refusal", err)
		}
		b := make([]byte, 12)
		if err := g.AllReduce(ctx, b[1:9], b[1:9], 2, "f32", "sum", Options{}); err == nil {
			return errors.New("misaligned buffer accepted")
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestAlgorithmSelection checks the host_shm size rules and that an
// explicit algorithm is honoured.
func TestAlgorithmSelection(t *testing.T) {
	g, err := New(context.Background(), Config{Rank: 0, WorldSize: 4, Store: nopStore{}, Group: "sel", Library: testLibrary})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		coll  coll.Collective
		bytes int64
		want  coll.Algorithm
	}{
		{coll.AllReduce, 2 << 10, coll.OneShot},
		{coll.AllReduce, 2<<10 + 1, coll.TwoShot},
		{coll.AllReduce, 16 << 20, coll.TwoShot},
		{coll.ReduceScatter, 16 << 20, coll.OneShot},
		{coll.AllGather, 1, coll.OneShot},
	} {
		if got, err := g.Algorithm(c.coll, c.bytes); got != c.want || err != nil {
			t.Errorf("%s %d bytes: %s %v, want %s", c.coll, c.bytes, got, err, c.want)
		}
	}
	// Above world 4 the shipped rules use two-shot at every size.
	g8, err := New(context.Background(), Config{Rank: 0, WorldSize: 8, Store: nopStore{}, Group: "sel", Library: testLibrary})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := g8.Algorithm(coll.AllReduce, 1<<10); got != coll.TwoShot || err != nil {
		t.Errorf("world 8, allreduce 1 KiB: %s %v, want twoshot", got, err)
	}
	// A library without host_shm rules is an error, never a hard-coded
	// guess beside the rules.
	bare, err := New(context.Background(), Config{Rank: 0, WorldSize: 4, Store: nopStore{}, Group: "sel", Library: &kernels.Library{Package: "bare"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Algorithm(coll.AllReduce, 1<<20); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "no host_shm rules") {
		t.Errorf("library without rules: %v", err)
	}
}

// TestConcurrentCollectives issues collectives from 8 goroutines per rank
// at once, with the first ones racing into lazy set-up; each goroutine owns
// the tags congruent to its index, so streams never share a slot.
func TestConcurrentCollectives(t *testing.T) {
	const world, streams, per = 4, 8, 6
	setups := countSetups(t)
	errs := goroutineGroup(t, world, Config{Slots: streams, Lanes: 2, SlotBytes: 2 * 4096}, func(g *Group) error {
		var wg sync.WaitGroup
		errs := make([]error, streams)
		for s := 0; s < streams; s++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < per; i++ {
					tag := uint64(s + streams*i + streams) // nonzero, == s mod streams
					o := op{coll: coll.AllReduce, dtype: []coll.DType{coll.F32, coll.BF16, coll.I64}[i%3], red: "sum",
						count: 100 + 977*s + 13*i, tag: tag, seed: int(tag)}
					if i%3 == 2 {
						o = op{coll: coll.AllGather, dtype: "f16", count: 50 + s, tag: tag, seed: int(tag)}
					}
					if _, err := runOp(context.Background(), g, o); err != nil {
						errs[s] = err
						return
					}
				}
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	if n := setups(); n != world {
		t.Fatalf("set-up ran %d times for %d ranks", n, world)
	}
}

// TestTagMismatchNeverMixes: two ranks run different collectives on the
// same slot (tags 1 and 5 with 4 slots); both must fail with ErrMismatch
// instead of combining each other's data.
func TestTagMismatchNeverMixes(t *testing.T) {
	errs := goroutineGroup(t, 2, Config{Timeout: 5 * time.Second}, func(g *Group) error {
		tag := uint64(1 + 4*g.Rank())
		_, err := runOp(context.Background(), g, op{coll: coll.AllReduce, alg: coll.OneShot, dtype: "f32", red: "sum", count: 64, tag: tag})
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) && !errors.Is(err, ErrPeerFailed) {
			t.Errorf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
	if !errors.Is(errs[0], ErrMismatch) && !errors.Is(errs[1], ErrMismatch) {
		t.Errorf("no rank saw the mismatch: %v", errs)
	}
}

// TestTwoGroupsSameRanks runs two groups over the same goroutine ranks at
// once: one pair with different names on one store, one pair with the
// same name on two stores (the nonce keeps their segments apart).
func TestTwoGroupsSameRanks(t *testing.T) {
	for _, sameName := range []bool{false, true} {
		t.Run(fmt.Sprint("sameName=", sameName), func(t *testing.T) {
			var wg sync.WaitGroup
			var errA, errB []error
			cfgA, cfgB := Config{Group: "A"}, Config{Group: "B"}
			if sameName {
				cfgB.Group = "A"
			}
			run := func(cfg Config, seed int, out *[]error) {
				defer wg.Done()
				*out = goroutineGroup(t, 3, cfg, func(g *Group) error {
					for i := 0; i < 20; i++ {
						if _, err := runOp(context.Background(), g, op{coll: coll.AllReduce, dtype: "f64", red: "sum", count: 333 + i, seed: seed + i}); err != nil {
							return err
						}
					}
					return nil
				})
			}
			wg.Add(2)
			go run(cfgA, 100, &errA)
			go run(cfgB, 200, &errB)
			wg.Wait()
			if err := errors.Join(firstErr(errA), firstErr(errB)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTimeoutNamesMissingRank: a collective that times out, by
// Config.Timeout or by its context's deadline (before Config.Timeout), is
// ErrTimeout naming the rank that did not arrive, in time, and leaves the
// group broken; by the context's deadline it is context.DeadlineExceeded
// too (it used to be that alone, "context deadline exceeded", with no
// rank named).
func TestTimeoutNamesMissingRank(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, byCtx := range []bool{false, true} {
		t.Run(map[bool]string{false: "Config.Timeout", true: "context deadline"}[byCtx], func(t *testing.T) {
			// Set-up runs under goroutineGroup's generous timeout, outside
			// the timed part; rank 0 then lowers its own wait timeout (or
			// takes a context with a deadline) for the timed collective,
			// while rank 1 (set up, alive) stays away until rank 0 is done,
			// so neither a slow set-up nor a sleep's length decides anything.
			var got error
			done := make(chan struct{})
			errs := goroutineGroup(t, 2, Config{}, func(g *Group) error {
				if err := g.Setup(context.Background()); err != nil {
					return err
				}
				if g.Rank() == 1 {
					<-done
					return nil
				}
				defer close(done)
				ctx := context.Background()
				if byCtx {
					c, cancel := context.WithTimeout(ctx, timeout)
					defer cancel()
					ctx = c
				} else {
					g.timeout = timeout
				}
				start := time.Now()
				got = g.AllReduce(ctx, make([]byte, 64), make([]byte, 64), 16, "f32", "sum", Options{})
				if d := time.Since(start); d > timeout+5*time.Second {
					return fmt.Errorf("took %v", d)
				}
				if err := g.AllReduce(context.Background(), make([]byte, 64), make([]byte, 64), 16, "f32", "sum", Options{}); !errors.Is(err, ErrBroken) {
					return fmt.Errorf("second call after failure: %v, want ErrBroken", err)
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(got, ErrTimeout) || !strings.Contains(got.Error(), "ranks [1]") || errors.Is(got, context.DeadlineExceeded) != byCtx {
				t.Fatalf("got %v, want a timeout naming ranks [1], context.DeadlineExceeded %v", got, byCtx)
			}
			t.Log(got)
		})
	}
}

// TestPortableLibrary runs a reduced sweep with the portable reduce loops
// that stand in when no generated library is linked.
func TestPortableLibrary(t *testing.T) {
	errs := goroutineGroup(t, 3, Config{Library: PortableLibrary()}, func(g *Group) error {
		for _, o := range sweep([]int{1, 100}, 3) {
			if _, err := runOp(context.Background(), g, o); err != nil {
				return err
			}
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestHugeCount checks that a count whose byte size overflows is refused
// with ErrInvalidArgument by every collective, before anything multiplies
// it (it used to wrap and panic in a lane goroutine).
func TestHugeCount(t *testing.T) {
	errs := goroutineGroup(t, 2, Config{}, func(g *Group) error {
		ctx := context.Background()
		small := make([]byte, 64)
		for _, n := range []int{1 << 62, math.MaxInt, math.MaxInt / 2, 17} {
			for _, c := range []struct {
				name string
				run  func() error
			}{
				{"allreduce", func() error { return g.AllReduce(ctx, small, small, n, coll.F32, coll.Sum, Options{}) }},
				{"reduce_scatter", func() error { return g.ReduceScatter(ctx, small, small, n, coll.F64, coll.Max, Options{}) }},
				{"allgather", func() error { return g.AllGather(ctx, small, small, n, coll.BF16, Options{}) }},
			} {
				if err := c.run(); !errors.Is(err, ErrInvalidArgument) {
					return fmt.Errorf("%s of %d elements in 64 bytes: got %v, want ErrInvalidArgument", c.name, n, err)
				}
			}
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestPortableLibraryRulesAreTheSpecs: PortableLibrary's host_shm rules
// are the generated library's (the shipped spec's), so tools and tests
// without generated code choose as users' programs do. (Its doc and rules
// said one-shot up to 32 KiB after the spec moved to 2 KiB.)
func TestPortableLibraryRulesAreTheSpecs(t *testing.T) {
	var want []kernels.Selection
	for _, s := range collectives.Library.Selections {
		if s.Kind == coll.HostSHM {
			want = append(want, s)
		}
	}
	if got := PortableLibrary().Selections; !reflect.DeepEqual(got, want) {
		t.Errorf("PortableLibrary's selections:\n%+v\nthe generated library's:\n%+v", got, want)
	}
}

// TestConfigBounds: sizes that would overflow the segment's size are
// refused by name, before any segment is made.
func TestConfigBounds(t *testing.T) {
	for _, sb := range []int{-1, MaxSlotBytes + 1, 9e18} {
		_, err := New(context.Background(), Config{Rank: 0, WorldSize: 2, Store: rendezvous.NewMemStore(), Group: "bounds", SlotBytes: sb})
		if err == nil || !strings.Contains(err.Error(), "Config.SlotBytes") {
			t.Errorf("SlotBytes %d: New = %v; want an error naming Config.SlotBytes", sb, err)
		}
	}
}

// TestOverlapOtherThanInPlaceRefused: an input and output that share
// memory other than in the documented in-place layout are refused with
// ErrInvalidArgument on every rank, before the call takes part. Such an
// all-reduce (output 64 bytes past its input, several pieces) wrote pieces
// of its output over input not yet staged and returned wrong sums with no
// error.
func TestOverlapOtherThanInPlaceRefused(t *testing.T) {
	const n = 1 << 16 // 256 KiB of f32: four pieces of the 256 KiB slot
	errs := goroutineGroup(t, 2, Config{Lanes: 1, SlotBytes: 256 << 10}, func(g *Group) error {
		ctx, rank := context.Background(), g.Rank()
		buf := make([]byte, 4*(2*n+64))
		var bad []string
		for _, c := range []struct {
			name string
			run  func() error
		}{
			{"allreduce, output 64 bytes on", func() error { return g.AllReduce(ctx, buf[:4*n], buf[64:], n, coll.F32, coll.Sum, Options{}) }},
			{"allreduce, output 64 bytes before", func() error { return g.AllReduce(ctx, buf[64:], buf, n, coll.F32, coll.Sum, Options{}) }},
			{"reduce_scatter, output at the other rank's block", func() error {
				return g.ReduceScatter(ctx, buf[:8*n], buf[(1-rank)*4*n:], n, coll.F32, coll.Sum, Options{})
			}},
			{"allgather, input at the other rank's block", func() error {
				return g.AllGather(ctx, buf[(1-rank)*4*n:], buf[:8*n], n, coll.F32, Options{})
			}},
		} {
			if err := c.run(); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "in place") {
				bad = append(bad, fmt.Sprintf("%s: got %v, want ErrInvalidArgument naming the in-place layout", c.name, err))
			}
		}
		// The in-place layouts still run.
		if err := g.AllReduce(ctx, buf[:4*n], buf[:4*n], n, coll.F32, coll.Sum, Options{}); err != nil {
			bad = append(bad, fmt.Sprintf("in-place allreduce: %v", err))
		}
		if err := g.ReduceScatter(ctx, buf[:8*n], buf[rank*4*n:], n, coll.F32, coll.Sum, Options{}); err != nil {
			bad = append(bad, fmt.Sprintf("in-place reduce_scatter: %v", err))
		}
		if err := g.AllGather(ctx, buf[rank*4*n:], buf[:8*n], n, coll.F32, Options{}); err != nil {
			bad = append(bad, fmt.Sprintf("in-place allgather: %v", err))
		}
		if len(bad) > 0 {
			return errors.New(strings.Join(bad, "\n"))
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestForgetRefusesBadArguments: Forget with no store, no group name or
// a world size New would refuse is ErrInvalidArgument, not a nil-pointer
// panic or a loop over a world of 2^40 ranks' keys.
func TestForgetRefusesBadArguments(t *testing.T) {
	st := rendezvous.NewMemStore()
	defer st.Close()
	for _, c := range []struct {
		name  string
		st    rendezvous.Store
		group string
		world int
	}{
		{"nil store", nil, "g", 2},
		{"no group", st, "", 2},
		{"world 0", st, "g", 0},
		{"world 2^40", st, "g", 1 << 40},
	} {
		if err := Forget(context.Background(), c.st, c.group, c.world); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: Forget = %v, want ErrInvalidArgument", c.name, err)
		}
	}
	if err := Forget(context.Background(), st, "g", 2); err != nil {
		t.Errorf("Forget of a group never formed: %v", err)
	}
}

// TestSegmentBeyondMemory: a layout whose segment is larger than the
// memory the process has left (64 slots of MaxSlotBytes: 4 TiB) fails the
// set-up with ErrSharedMemory naming the fields to shrink, for goroutine
// ranks too, whose ordinary-memory segment used to be a Go allocation
// that the runtime could not make: "fatal error: out of memory", which
// ends the process and no recover catches.
func TestSegmentBeyondMemory(t *testing.T) {
	avail, ok := meminfo.Available()
	if !ok {
		t.Skip("no memory figures to compare with here")
	}
	g, err := New(context.Background(), Config{Rank: 0, WorldSize: 1, Store: rendezvous.NewMemStore(), Group: "huge",
		Library: testLibrary, Slots: 64, SlotBytes: MaxSlotBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if size := g.defaultLayout().size(); int64(size) <= avail {
		t.Skipf("a %d-byte segment fits the %d bytes available", size, avail)
	}
	err = g.Setup(context.Background())
	if !errors.Is(err, ErrSharedMemory) || !strings.Contains(err.Error(), "Config.SlotBytes") {
		t.Fatalf("Setup = %v; want ErrSharedMemory naming Config.SlotBytes", err)
	}
	b := make([]byte, 64)
	if err := g.AllReduce(context.Background(), b, b, 16, coll.F32, coll.Sum, Options{}); !errors.Is(err, ErrBroken) {
		t.Errorf("a call after the failed set-up: %v, want ErrBroken", err)
	}
}

// TestConfigErrorsAreInvalidArgument: every Config New refuses matches
// ErrInvalidArgument, and its message is the check's alone.
func TestConfigErrorsAreInvalidArgument(t *testing.T) {
	st := rendezvous.NewMemStore()
	ok := Config{Rank: 0, WorldSize: 2, Store: st, Group: "cfg"}
	for name, mod := range map[string]func(*Config){
		"world":     func(c *Config) { c.WorldSize = 0 },
		"rank":      func(c *Config) { c.Rank = 2 },
		"store":     func(c *Config) { c.Store = nil },
		"group":     func(c *Config) { c.Group = "" },
		"slots":     func(c *Config) { c.Slots = 65 },
		"lanes":     func(c *Config) { c.Lanes = MaxLanes + 1 },
		"slotBytes": func(c *Config) { c.SlotBytes = -1 },
	} {
		cfg := ok
		mod(&cfg)
		_, err := New(context.Background(), cfg)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: New = %v; want an error matching ErrInvalidArgument", name, err)
		} else if strings.Contains(err.Error(), ErrInvalidArgument.Error()) {
			t.Errorf("%s: %q repeats the sentinel's text", name, err)
		}
	}
	if g, err := New(context.Background(), ok); err != nil {
		t.Fatalf("valid Config: %v", err)
	} else {
		g.Close()
	}
}

// TestErrorsSayWhatToDo: a refusal names the problem once (ErrInvalidArgument
// already says "host: ") and, where the spec is what lacks something, what
// to add to it.
func TestErrorsSayWhatToDo(t *testing.T) {
	noLoops := &kernels.Library{Package: "mine", Kernels: testLibrary.Kernels, Selections: testLibrary.Selections, Sources: testLibrary.Sources}
	errs := goroutineGroup(t, 2, Config{Library: noLoops}, func(g *Group) error {
		ctx := context.Background()
		var bad []string
		check := func(what string, err error, want string) {
			if !errors.Is(err, ErrInvalidArgument) || strings.Contains(err.Error(), "host: host:") || !strings.Contains(err.Error(), want) {
				bad = append(bad, fmt.Sprintf("%s: got %v, want ErrInvalidArgument saying %q once", what, err, want))
			}
		}
		// all-gather needs no reduce loop: these reach the schedule checks
		check("oneshot_ll", g.AllGather(ctx, make([]byte, 8), make([]byte, 16), 2, "f32", Options{Algorithm: "oneshot_ll"}), "host backend does not allow")
		check("hcm", g.AllGather(ctx, make([]byte, 8), make([]byte, 16), 2, "f32", Options{Algorithm: "hcm"}), "hcm")
		check("no loop", g.AllReduce(ctx, make([]byte, 8), make([]byte, 8), 2, "f32", "max", Options{}),
			`library "mine" has no host reduce loop for f32 max: its spec must list f32 in dtypes.reduce (the top-level list, or the host_shm topology's own) and max in the top-level ops, then run collgen generate`)
		if len(bad) > 0 {
			return errors.New(strings.Join(bad, "\n"))
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	noRules := &kernels.Library{Package: "mine", HostReducers: testLibrary.HostReducers}
	g, err := New(context.Background(), Config{Rank: 0, WorldSize: 2, Store: nopStore{}, Group: "norules", Library: noRules})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Algorithm(coll.AllReduce, 64); !errors.Is(err, ErrInvalidArgument) || strings.Contains(err.Error(), "host: host:") ||
		!strings.Contains(err.Error(), `library "mine" has no host_shm rules for allreduce at world size 2`) {
		t.Errorf("no rules: %v", err)
	}
}
