package hostbench

import (
	"context"
	"strings"

	"errors"
	"github.com/collgen/collgen/runtime/host"
	"github.com/collgen/collgen/runtime/rendezvous"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
)

// TestWarmUp: a cold first round that alone outlasts the warm-up does not
// size the run (it did, giving 2-16 MiB sweeps 7-35 iterations); the next
// round does. Rounds double; errors end the warm-up.
func TestWarmUp(t *testing.T) {
	var ns []int
	elapsed := 0.0
	per, err := warmUp(20*time.Millisecond, func(n int) (float64, float64, error) {
		ns = append(ns, n)
		if len(ns) == 1 {
			elapsed += 0.036
			return 0.012, elapsed, nil // page faults
		}
		elapsed += float64(n) * 0.001
		return 0.001, elapsed, nil
	})
	if err != nil || per != 0.001 || len(ns) != 2 || ns[0] != 3 || ns[1] != 6 {
		t.Errorf("warmUp = %v, %v after rounds %v; want 0.001 s from the second round of 6", per, err, ns)
	}
	ns = nil
	elapsed = 0
	per, _ = warmUp(50*time.Millisecond, func(n int) (float64, float64, error) {
		ns = append(ns, n)
		elapsed += float64(n) * 0.002
		return 0.002, elapsed, nil
	})
	if per != 0.002 || len(ns) != 4 { // 6, 18, 42, 90 ms elapsed
		t.Errorf("fast rounds: %v after %v; want 4 rounds", per, ns)
	}
	boom := errors.New("boom")
	if _, err := warmUp(time.Second, func(int) (float64, float64, error) { return 0, 0, boom }); !errors.Is(err, boom) {
		t.Errorf("error: %v", err)
	}
}

// TestBytesHuge: a sweep of sizes near 2^63 bytes needs more than any
// host has; Bytes says so instead of wrapping round to a negative figure
// (which the bench's memory check let through to a panicking make).
func TestBytesHuge(t *testing.T) {
	const huge = int64(1<<63 - 1)
	for _, check := range []bool{false, true} {
		o := Options{Collectives: []coll.Collective{coll.AllReduce}, DTypes: []coll.DType{coll.F32}, Ops: []coll.Op{"sum"},
			Sizes: []int64{huge}, Check: check}
		cases := Cases(o, 2)
		if len(cases) != 1 {
			t.Fatalf("cases %v", cases)
		}
		if n := Bytes(o, cases, 2); n < huge/2 {
			t.Errorf("check %v: Bytes = %d, want at least %d", check, n, huge/2)
		}
	}
}

// TestCheckStaleOutput: --check of a case whose collective writes nothing
// fails, even when the output buffer still holds the right answer from an
// earlier case of the same collective, dtype, op and size (another
// algorithm before it, as --sizes 1MiB --algorithms a,b runs them). The
// output shared by every case was not cleared before the check run, so
// such a case passed.
func TestCheckStaleOutput(t *testing.T) {
	ctx := context.Background()
	g, err := host.New(ctx, host.Config{Rank: 0, WorldSize: 1, Store: rendezvous.NewMemStore(), Group: "stale"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	o := Options{Iters: 1, Check: true}
	for _, c := range []Case{
		{Collective: coll.AllReduce, Algorithm: coll.Auto, DType: coll.F32, Op: coll.Sum, Bytes: 4096},
		{Collective: coll.ReduceScatter, Algorithm: coll.Auto, DType: coll.BF16, Op: coll.Max, Bytes: 4096},
		{Collective: coll.AllGather, Algorithm: coll.Auto, DType: coll.I32, Bytes: 4096},
	} {
		in, out := alignedBytes(4096), alignedBytes(4096)
		if _, err := runCase(ctx, g, o, c, in, out, time.Millisecond); err != nil {
			t.Fatalf("%s: a correct run: %v", c.Label(), err)
		}
		call = func(context.Context, *host.Group, Case, []byte, []byte, int) error { return nil }
		_, err := runCase(ctx, g, o, c, in, out, time.Millisecond)
		call = do
		if err == nil || !strings.Contains(err.Error(), "wrong result") {
			t.Errorf("%s: a collective that writes nothing passed the check (err %v)", c.Label(), err)
		}
	}
}

// TestAutoRowApart: the automatic selection's row reads "auto", with the
// algorithm it picked in Picked, and a forced row of that algorithm reads
// as that algorithm alone. Both rows once read the picked algorithm, so a
// sweep of --algorithms auto,oneshot had two "oneshot" rows per case, and
// --baseline could not tell which was which.
func TestAutoRowApart(t *testing.T) {
	ctx := context.Background()
	g, err := host.New(ctx, host.Config{Rank: 0, WorldSize: 1, Store: rendezvous.NewMemStore(), Group: "apart"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	picked, err := g.Algorithm(coll.AllReduce, 4096)
	if err != nil || picked == coll.Auto {
		t.Fatalf("the selection at 4 KiB: %q, %v", picked, err)
	}
	in, out := alignedBytes(4096), alignedBytes(4096)
	auto, err := runCase(ctx, g, Options{Iters: 1}, Case{Collective: coll.AllReduce, Algorithm: coll.Auto, DType: coll.F32, Op: coll.Sum, Bytes: 4096}, in, out, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	forced, err := runCase(ctx, g, Options{Iters: 1}, Case{Collective: coll.AllReduce, Algorithm: picked, DType: coll.F32, Op: coll.Sum, Bytes: 4096}, in, out, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if auto.Algorithm != "auto" || auto.Picked != string(picked) {
		t.Errorf("auto's row: algorithm %q, picked %q; want auto, %s", auto.Algorithm, auto.Picked, picked)
	}
	if forced.Algorithm != string(picked) || forced.Picked != "" {
		t.Errorf("the forced row: algorithm %q, picked %q; want %s, none", forced.Algorithm, forced.Picked, picked)
	}
}
