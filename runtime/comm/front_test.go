package comm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// hostComms makes world goroutine-rank host communicators on store; edit,
// if given, changes each rank's Config first.
func hostComms(t *testing.T, store rendezvous.Store, world int, group string, edit ...func(*Config)) []*Communicator {
	t.Helper()
	comms := make([]*Communicator, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := Config{Rank: r, WorldSize: world, Device: Host, Store: store,
				Library: collectives.Library, Group: group, Timeout: 5 * time.Second}
			for _, e := range edit {
				e(&cfg)
			}
			comms[r], errs[r] = New(context.Background(), cfg)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return comms
}

// TestHostArgumentErrors checks the front end's refusals on the host
// backend: each is ErrInvalidArgument with a message saying what is wrong,
// and none panics, including counts whose byte size overflows.
func TestHostArgumentErrors(t *testing.T) {
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "args")
	defer closeAll(t, comms)
	small := HostBuffer(make([]byte, 64))
	type tc struct {
		name string
		run  func(c *Communicator) error
		want string
	}
	cases := []tc{
		{"device buffer", func(c *Communicator) error {
			return c.AllReduce(DeviceBuffer(0x1000), small, 4, coll.F32, coll.Sum, Options{})
		}, "the input is a DeviceBuffer given to a host communicator"},
		{"zero buffer", func(c *Communicator) error { return c.AllGather(small, Buffer{}, 4, coll.F32, Options{}) }, "the output is the zero Buffer"},
		{"typed slice", func(c *Communicator) error {
			return c.AllReduce(HostSlice(make([]int32, 4)), HostSlice(make([]int32, 4)), 4, coll.F32, coll.Sum, Options{})
		}, "the input holds i32 elements but the call's dtype is f32"},
		{"short", func(c *Communicator) error { return c.AllReduce(small, small, 17, coll.F32, coll.Sum, Options{}) }, "the input has 64 bytes; 17 f32 elements need 68"},
		{"short gathered", func(c *Communicator) error { return c.AllGather(small, small, 16, coll.F32, Options{}) }, "the output has 64 bytes; 16 f32 elements need 128"},
		{"dtype", func(c *Communicator) error { return c.AllReduce(small, small, 1, "f17", coll.Sum, Options{}) }, `unknown name: dtype "f17"`},
		{"op", func(c *Communicator) error { return c.ReduceScatter(small, small, 1, coll.F32, "prod", Options{}) }, `unknown name: op "prod"`},
		{"fp8 reduce", func(c *Communicator) error { return c.AllReduce(small, small, 1, coll.E4M3, coll.Sum, Options{}) }, "e4m3 is copy-only"},
		{"negative", func(c *Communicator) error { return c.AllReduce(small, small, -1, coll.F32, coll.Sum, Options{}) }, "negative count -1"},
		{"algorithm", func(c *Communicator) error {
			return c.AllReduce(small, small, 1, coll.F32, coll.Sum, Options{Algorithm: "fastest"})
		}, `unknown name: algorithm "fastest"`},
	}
	for _, n := range []int{1 << 62, math.MaxInt, math.MaxInt / 3} {
		cases = append(cases,
			tc{"huge allreduce", func(c *Communicator) error { return c.AllReduce(small, small, n, coll.F64, coll.Sum, Options{}) }, "elements"},
			tc{"huge reduce_scatter", func(c *Communicator) error { return c.ReduceScatter(small, small, n, coll.BF16, coll.Max, Options{}) }, "elements"},
			tc{"huge allgather", func(c *Communicator) error { return c.AllGather(small, small, n, coll.I32, Options{}) }, "elements"})
	}
	for _, c := range cases {
		err := c.run(comms[0])
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want ErrInvalidArgument with %q", c.name, err, c.want)
		}
	}
	// Host refuses an algorithm it cannot run, with host's reason, as
	// ErrInvalidArgument through comm.
	errs := onRanks(comms, func(_ int, c *Communicator) error {
		return c.AllReduce(small, small, 4, coll.F32, coll.Sum, Options{Algorithm: coll.OneShotLL})
	})
	if !errors.Is(errs[0], ErrInvalidArgument) || !strings.Contains(errs[0].Error(), "host backend does not allow") {
		t.Errorf("oneshot_ll on the host: %v", errs[0])
	}
	errs = onRanks(comms, func(_ int, c *Communicator) error {
		return c.AllReduce(small, small, 4, coll.F32, coll.Sum, Options{Algorithm: coll.NCCL})
	})
	if !errors.Is(errs[0], ErrUnsupported) {
		t.Errorf("nccl on the host: %v, want ErrUnsupported", errs[0])
	}
	if _, err := comms[0].Alloc(context.Background(), 64); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Alloc on the host: %v", err)
	}
}

// TestHostSlices runs the typed slice helpers: count and dtype come from
// the slices.
func TestHostSlices(t *testing.T) {
	comms := hostComms(t, rendezvous.NewMemStore(), 3, "slices")
	defer closeAll(t, comms)
	outs := make([][]float32, 3)
	gathered := make([][]int64, 3)
	scattered := make([][]float64, 3)
	errs := onRanks(comms, func(r int, c *Communicator) error {
		in := []float32{float32(r), 1, 2, float32(10 * r)}
		outs[r] = make([]float32, 4)
		if err := AllReduceSlice(c, in, outs[r], coll.Sum, Options{}); err != nil {
			return err
		}
		gathered[r] = make([]int64, 6)
		if err := AllGatherSlice(c, []int64{int64(r), -int64(r)}, gathered[r], Options{}); err != nil {
			return err
		}
		scattered[r] = make([]float64, 1)
		return ReduceScatterSlice(c, []float64{1, 2, float64(r)}, scattered[r], coll.Max, Options{})
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range comms {
		if want := []float32{3, 3, 6, 30}; !equal(outs[r], want) {
			t.Errorf("rank %d all-reduce: %v, want %v", r, outs[r], want)
		}
		if want := []int64{0, 0, 1, -1, 2, -2}; !equal(gathered[r], want) {
			t.Errorf("rank %d all-gather: %v, want %v", r, gathered[r], want)
		}
		if want := []float64{[]float64{1, 2, 2}[r]}; !equal(scattered[r], want) {
			t.Errorf("rank %d reduce-scatter: %v, want %v", r, scattered[r], want)
		}
	}
	if err := AllGatherSlice(comms[0], []int64{1}, make([]int64, 2), Options{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("all-gather into 2 elements at world 3: %v", err)
	}
	if got := DTypeOf[BFloat16](); got != coll.BF16 {
		t.Errorf("DTypeOf[BFloat16] = %s", got)
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestWorldSizeMismatch starts three ranks with world sizes 2, 2 and 3:
// every one fails with ErrMismatch naming both sizes, and none waits for
// its timeout. The rank with world size 3 arrives first, so it formed the
// group and the other two find the mismatch; it learns of it through the
// group's poison while it waits for them.
func TestWorldSizeMismatch(t *testing.T) {
	store := rendezvous.NewMemStore()
	ctx := context.Background()
	cfg := func(rank, world int) Config {
		return Config{Rank: rank, WorldSize: world, Device: Host, Store: store, Library: collectives.Library, Group: "ws", Timeout: 5 * time.Second}
	}
	start := time.Now()
	errs := make([]error, 3)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, errs[2] = New(ctx, cfg(2, 3))
	}()
	if err := store.Wait(ctx, "collgen/comm/ws/world"); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = New(ctx, cfg(r, 2))
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "has world size 2, but group \"ws\" was formed with world size 3") {
			t.Errorf("rank %d: %v, want ErrMismatch naming world sizes 2 and 3", r, err)
		}
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("the ranks took %v to fail", el)
	}
	// The other order: ranks 0 and 1 have formed a group of 2 before rank
	// 2 arrives with world size 3. The group stands; the latecomer fails,
	// naming both sizes.
	cfg2 := func(rank, world int) Config {
		c := cfg(rank, world)
		c.Group = "ws2"
		return c
	}
	comms := make([]*Communicator, 2)
	errs = onRanks(comms, func(r int, _ *Communicator) (err error) {
		comms[r], err = New(ctx, cfg2(r, 2))
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	if _, err := New(ctx, cfg2(2, 3)); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "rank 2 has world size 3, but group \"ws2\" was formed with world size 2") {
		t.Errorf("late rank 2 of 3: %v", err)
	}
}

// TestDuplicateRank starts a second rank 0 beside a live group: it is
// refused, and the live group keeps working (its shared memory is not
// touched).
func TestDuplicateRank(t *testing.T) {
	store := rendezvous.NewMemStore()
	comms := hostComms(t, store, 2, "dup")
	defer closeAll(t, comms)
	_, err := New(context.Background(), Config{Rank: 0, WorldSize: 2, Device: Host, Store: store, Library: collectives.Library, Group: "dup"})
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "rank 0 of group \"dup\" has already joined") {
		t.Fatalf("duplicate rank 0: %v", err)
	}
	outs := make([][]float32, 2)
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		outs[r] = []float32{1, float32(r)}
		return AllReduceSlice(c, outs[r], outs[r], coll.Sum, Options{})
	})...); err != nil {
		t.Fatal(err)
	}
	if !equal(outs[1], []float32{2, 1}) {
		t.Errorf("live group after the duplicate: %v", outs[1])
	}
}

// newEach runs New for every rank of a world of 2 at once with cfg(r),
// closes those that formed and returns each rank's error.
func newEach(cfg func(r int) Config) []error {
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := New(context.Background(), cfg(r))
			if err == nil {
				c.Close()
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	return errs
}

// TestMembershipMismatch checks the agreement after joining: a rank on
// another backend is named.
func TestMembershipMismatch(t *testing.T) {
	store := rendezvous.NewMemStore()
	errs := newEach(func(r int) Config {
		return Config{Rank: r, WorldSize: 2, Device: Host, HostShared: r == 1, Store: store, Library: collectives.Library, Group: "mm"}
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "host-shared backend") {
			t.Errorf("rank %d: %v, want ErrMismatch naming the backends", r, err)
		}
	}
}

// TestHostRanksInOtherProcesses: ranks of an in-process host group
// (HostShared false) in processes of their own, as under collgen run when
// the program forgot HostShared, are refused at New on every rank with
// ErrInvalidArgument naming HostShared. Before, New passed and the first
// call failed with ErrAborted ("peer failed: map rank 1's segment").
func TestHostRanksInOtherProcesses(t *testing.T) {
	old := processOf
	processOf = func(cfg Config) string { return "process-of-rank-" + strconv.Itoa(cfg.Rank) }
	defer func() { processOf = old }()
	store := rendezvous.NewMemStore()
	errs := newEach(func(r int) Config {
		return Config{Rank: r, WorldSize: 2, Device: Host, Store: store, Library: collectives.Library, Group: "procs", Timeout: 5 * time.Second}
	})
	for r, err := range errs {
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "HostShared: true") {
			t.Errorf("rank %d: %v, want ErrInvalidArgument naming HostShared", r, err)
		}
	}
}

// TestReformAfterClose forms, closes and forms a group of the same name on
// the same store again.
func TestReformAfterClose(t *testing.T) {
	store := rendezvous.NewMemStore()
	closeAll(t, hostComms(t, store, 2, "again"))
	comms := hostComms(t, store, 3, "again")
	closeAll(t, comms)
	if err := comms[0].Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestHostDebugCheck runs the debug check mode on the host backend: count
// 0 on one rank and 8 on the other is named, on both ranks.
func TestHostDebugCheck(t *testing.T) {
	t.Setenv(EnvDebugCheck, "1")
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "check")
	defer closeAll(t, comms)
	errs := onRanks(comms, func(r int, c *Communicator) error {
		b := make([]float32, 8)
		return AllReduceSlice(c, b[:8*r], b[:8*r], coll.Sum, Options{})
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "rank 0 issued allreduce of 0 f32 sum") ||
			!strings.Contains(err.Error(), "rank 1 issued allreduce of 8 f32 sum") {
			t.Errorf("rank %d: %v, want ErrMismatch naming both counts", r, err)
		}
	}
	// A refusal on one rank is named on the others instead of leaving them
	// waiting.
	errs = onRanks(comms, func(r int, c *Communicator) error {
		dt := coll.F32
		if r == 1 {
			dt = "f17"
		}
		return c.AllReduce(HostBuffer(make([]byte, 64)), HostBuffer(make([]byte, 64)), 4, dt, coll.Sum, Options{})
	})
	if !errors.Is(errs[0], ErrMismatch) || !strings.Contains(errs[0].Error(), "refused") {
		t.Errorf("rank 0 beside a refusing rank 1: %v", errs[0])
	}
	// The same refusal on every rank is agreement: each returns its own.
	errs = onRanks(comms, func(r int, c *Communicator) error {
		return c.AllReduce(HostBuffer(make([]byte, 64)), HostBuffer(make([]byte, 64)), 4, "f17", coll.Sum, Options{})
	})
	for r, err := range errs {
		if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d, the same refusal everywhere: %v, want ErrInvalidArgument", r, err)
		}
	}
	// Matching calls run.
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		return AllReduceSlice(c, []float32{1, 2}, make([]float32, 2), coll.Sum, Options{})
	})...); err != nil {
		t.Error(err)
	}
	t.Setenv(EnvDebugCheck, "yes")
	if _, err := New(context.Background(), Config{WorldSize: 1, Device: Host, Store: rendezvous.NewMemStore(), Library: collectives.Library}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("%s=yes: %v", EnvDebugCheck, err)
	}
}

// TestHostConfigError checks that a configuration the host backend
// refuses fails at once, before waiting for other ranks.
func TestHostConfigError(t *testing.T) {
	_, err := New(context.Background(), Config{Rank: 0, WorldSize: 65, Device: Host, Store: rendezvous.NewMemStore(), Library: collectives.Library})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "world size 65 out of range 1..64") {
		t.Errorf("world 65 on the host: %v", err)
	}
}

// TestNoGPUSaysWhatToSet checks that forgetting Device: comm.Host on a
// machine without a GPU (or without cgo) says what to set.
func TestNoGPUSaysWhatToSet(t *testing.T) {
	if _, err := openDevice(Config{Device: 0}); err == nil {
		t.Skip("this machine has a usable GPU")
	}
	_, err := New(context.Background(), Config{WorldSize: 1, Store: rendezvous.NewMemStore(), Library: collectives.Library})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "set Config.Device = comm.Host") {
		t.Errorf("got %v", err)
	}
}

// TestHostErrorsMatchSentinels checks that the host backend's own errors
// match comm's sentinels: ranks issuing different counts (which the host
// backend sees at its first barrier) get ErrMismatch, or ErrAborted for a
// rank whose peer gave up first; the group is then broken (ErrAborted).
func TestHostErrorsMatchSentinels(t *testing.T) {
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "sentinels")
	defer closeAll(t, comms)
	errs := onRanks(comms, func(r int, c *Communicator) error {
		b := make([]float32, 64)
		return AllReduceSlice(c, b[:32+32*r], b[:32+32*r], coll.Sum, Options{})
	})
	mismatch := false
	for r, err := range errs {
		mismatch = mismatch || errors.Is(err, ErrMismatch)
		if !errors.Is(err, ErrMismatch) && !errors.Is(err, ErrAborted) {
			t.Errorf("rank %d: %v, want ErrMismatch or ErrAborted", r, err)
		}
	}
	if !mismatch {
		t.Errorf("no rank reported ErrMismatch: %v", errs)
	}
	if err := AllReduceSlice(comms[0], []float32{1}, []float32{1}, coll.Sum, Options{}); !errors.Is(err, ErrAborted) {
		t.Errorf("after the failure: %v, want ErrAborted (the group is broken)", err)
	}
}

// TestHostReformSameName: a host group is formed, used and closed three
// times under one name on one store, with goroutine ranks in process
// memory and with POSIX segments: every round's collective is right.
// (Before, the host group's store keys had no formation id: the second
// round met the first one's nonce and created/mapped marks, skipped its
// barriers and mapped segments that were gone or not yet sized.)
func TestHostReformSameName(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			store := rendezvous.NewMemStore()
			for round := range 3 {
				comms := hostComms(t, store, 2, "same", func(c *Config) { c.HostShared = shared })
				outs := make([][]float32, 2)
				err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
					outs[r] = []float32{float32(round), float32(r + 1)}
					return AllReduceSlice(c, outs[r], outs[r], coll.Sum, Options{})
				})...)
				closeAll(t, comms)
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				for r, o := range outs {
					if o[0] != float32(2*round) || o[1] != 3 {
						t.Errorf("round %d, rank %d: %v; want [%d 3]", round, r, o, 2*round)
					}
				}
			}
		})
	}
}

// TestNewMissingRankNamed: a rank that never calls New fails the others at
// ctx's deadline with ErrTimeout naming it (not a store key).
func TestNewMissingRankNamed(t *testing.T) {
	store := rendezvous.NewMemStore()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, errs[r] = New(ctx, Config{Rank: r, WorldSize: 3, Device: Host, Store: store, Library: collectives.Library, Group: "nj"})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "missing ranks [2]") {
			t.Errorf("rank %d: %v; want ErrTimeout naming rank 2", r, err)
		}
	}
}

// TestHostAbortDuringSetup: rank 0's first collective waits in the host
// backend's set-up for rank 1, which has not called yet; Abort from another
// goroutine returns at once and the call fails with ErrAborted. (Before,
// both waited for set-up's whole timeout.)
func TestHostAbortDuringSetup(t *testing.T) {
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "abortsetup")
	defer closeAll(t, comms)
	done := make(chan error, 1)
	go func() {
		out := []float32{1}
		done <- AllReduceSlice(comms[0], out, out, coll.Sum, Options{})
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	comms[0].Abort()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Abort took %v while set-up waited for a peer", d)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrAborted) {
			t.Errorf("the call: %v; want ErrAborted", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the call did not return after Abort")
	}
}

// TestCallWithDoneContext: a call whose context is already cancelled
// returns at once on that rank without taking part, and the group stays
// usable: the next call on every rank runs. (Before, the rank offered its
// input and then failed the wait, so its peer finished the collective while
// it broke its group.)
func TestCallWithDoneContext(t *testing.T) {
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "donectx")
	defer closeAll(t, comms)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := []float32{1}
	if err := AllReduceSlice(comms[0], out, out, coll.Sum, Options{Context: ctx}); !errors.Is(err, ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v; want ErrAborted wrapping context.Canceled", err)
	}
	outs := make([][]float32, 2)
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		outs[r] = []float32{float32(r + 1)}
		return AllReduceSlice(c, outs[r], outs[r], coll.Sum, Options{})
	})...); err != nil {
		t.Fatal(err)
	}
	if outs[0][0] != 3 || outs[1][0] != 3 {
		t.Errorf("next call: %v; want 3 on both ranks", outs)
	}
}

// withoutHostWorlds is the shipped library whose host_shm rules cover only
// the given world sizes (none: no host_shm topology at all).
func withoutHostWorlds(worlds ...int) *kernels.Library {
	lib := collectives.Library
	var sels []kernels.Selection
	for _, s := range lib.Selections {
		if s.Kind == coll.HostSHM {
			if len(worlds) == 0 {
				continue
			}
			s.Worlds = worlds
		}
		sels = append(sels, s)
	}
	return shippedWith(nil, sels)
}

// A library whose spec has no host_shm topology, or none at the world
// size, has no rules for host ranks: the automatic choice says that and
// what to add to the spec, not that "the host_shm rules select nccl"
// (there are none). A named algorithm still runs.
func TestHostNoRulesSaysWhatToAdd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lib    *kernels.Library
		want   string
		wantNo string
	}{
		{"no host_shm topology", withoutHostWorlds(), `library "collectives" has no host_shm topology`, "rules select nccl"},
		{"other world sizes", withoutHostWorlds(3, 4), `host_shm topology host has no world size 2 for allreduce (it has 3, 4): add 2 to its world_sizes`, "rules select nccl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := hostComms(t, rendezvous.NewMemStore(), 2, "norules", func(c *Config) { c.Library = tc.lib })
			defer closeAll(t, comms)
			xs := make([]float32, 64)
			errs := onRanks(comms, func(_ int, c *Communicator) error {
				return AllReduceSlice(c, xs, make([]float32, 64), coll.Sum, Options{})
			})
			for r, err := range errs {
				if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.wantNo) {
					t.Errorf("rank %d: %v; want ErrUnsupported saying %q", r, err, tc.want)
				}
			}
			if _, err := comms[0].Choose(coll.AllReduce, 256, coll.F32, coll.Sum); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Choose: %v; want ErrUnsupported saying %q", err, tc.want)
			}
			errs = onRanks(comms, func(r int, c *Communicator) error {
				return AllReduceSlice(c, []float32{float32(r + 1)}, xs[r:r+1], coll.Sum, Options{Algorithm: coll.OneShot})
			})
			if err := errors.Join(errs...); err != nil || xs[0] != 3 || xs[1] != 3 {
				t.Errorf("named oneshot: %v, got %v", err, xs[:2])
			}
		})
	}
}

// TestHalfSlices: bf16 and f16 slices are filled and read through comm's
// own conversions (no import of runtime/numeric needed), rounding to
// nearest even.
func TestHalfSlices(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		bf16 float32
		f16  float32
	}{{1, 1, 1}, {-2.5, -2.5, -2.5}, {1.00390625, 1, 1.00390625}, {65504, 65536, 65504}, {1e6, 999424, float32(math.Inf(1))}} {
		if got := ToBFloat16(tc.f).Float32(); got != tc.bf16 {
			t.Errorf("ToBFloat16(%v).Float32() = %v, want %v", tc.f, got, tc.bf16)
		}
		if got := ToFloat16(tc.f).Float32(); got != tc.f16 {
			t.Errorf("ToFloat16(%v).Float32() = %v, want %v", tc.f, got, tc.f16)
		}
	}
	if got := ToBFloat16(float32(math.NaN())).Float32(); !math.IsNaN(float64(got)) {
		t.Errorf("bf16 NaN: %v", got)
	}
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "halves")
	defer closeAll(t, comms)
	outs := make([][]BFloat16, 2)
	errs := onRanks(comms, func(r int, c *Communicator) error {
		in := []BFloat16{ToBFloat16(float32(r) + 0.5), ToBFloat16(-1)}
		outs[r] = make([]BFloat16, 2)
		return AllReduceSlice(c, in, outs[r], coll.Sum, Options{})
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r, o := range outs {
		if o[0].Float32() != 2 || o[1].Float32() != -2 {
			t.Errorf("rank %d: %v %v, want 2 -2", r, o[0].Float32(), o[1].Float32())
		}
	}
}

// withHostTopology is the shipped library plus a second host_shm topology,
// name, whose rules send every size of every collective to use.
func withHostTopology(name string, use coll.Algorithm) *kernels.Library {
	lib := collectives.Library
	sels := slices.Clone(lib.Selections)
	for _, s := range lib.Selections {
		if s.Kind == coll.HostSHM {
			s.Topology = name
			s.Rules = []kernels.Rule{{Use: use}}
			sels = append(sels, s)
		}
	}
	return shippedWith(nil, sels)
}

// Config.Topology on host ranks picks that host_shm topology's rules; a
// name that is no host_shm topology of the library (misspelt, or a GPU
// one) fails New at once. Both were ignored: the first host_shm
// topology's rules always chose.
func TestHostNamedTopology(t *testing.T) {
	lib := withHostTopology("host2", coll.TwoShot)
	for _, tc := range []struct{ topology, want string }{{"", "oneshot"}, {"host", "oneshot"}, {"host2", "twoshot"}} {
		comms := hostComms(t, rendezvous.NewMemStore(), 2, "named", func(c *Config) { c.Library, c.Topology = lib, tc.topology })
		// 64 bytes: the shipped host rules pick the one-shot up to 2 KiB.
		if got, err := comms[0].Choose(coll.AllReduce, 64, coll.F32, coll.Sum); err != nil || string(got) != tc.want {
			t.Errorf("Topology %q: Choose = %v, %v; want %s", tc.topology, got, err, tc.want)
		}
		closeAll(t, comms)
	}
	for _, name := range []string{"bogus", "nvswitch"} {
		// Refused before the group forms: no peer is needed (the deadline
		// bounds the wait for one where the name is not checked).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := New(ctx, Config{Rank: 0, WorldSize: 2, Device: Host, Store: rendezvous.NewMemStore(), Library: lib, Topology: name})
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprintf("Config.Topology %q is not a host_shm topology", name)) ||
			!strings.Contains(err.Error(), "[host host2]") {
			t.Errorf("Topology %q: %v; want ErrInvalidArgument naming the host_shm topologies", name, err)
		}
	}
}

// A group formed, used and closed leaves no keys in the store: the last
// member to leave deletes the formation's (about a dozen per formation
// were kept, so a process re-forming groups on one long-lived store grew
// it without bound), for goroutine and shared-memory ranks, with the debug
// check on too.
func TestClosedGroupLeavesNoStoreKeys(t *testing.T) {
	needForgottenDeviceKeys(t)
	for _, tc := range []struct {
		name   string
		shared bool
		debug  bool
	}{{"goroutines", false, false}, {"shared", true, false}, {"debug check", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.debug {
				t.Setenv(EnvDebugCheck, "1")
			}
			st := storetest.NewKeyStore(rendezvous.NewMemStore())
			for round := 0; round < 3; round++ {
				comms := hostComms(t, st, 3, "keys", func(c *Config) { c.HostShared = tc.shared })
				errs := onRanks(comms, func(r int, c *Communicator) error {
					xs := []float32{float32(r), 1}
					if err := AllReduceSlice(c, xs, xs, coll.Sum, Options{}); err != nil {
						return err
					}
					return AllGatherSlice(c, xs[:1], make([]float32, 3), Options{})
				})
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				closeAll(t, comms)
				if left := st.Live(); len(left) > 0 {
					t.Fatalf("round %d: %d keys left after every rank closed: %q", round, len(left), left)
				}
			}
		})
	}
	// GPU ranks over fake devices: the formation's and the GPU set-up's
	// own exchanges, and the device keys the fakes publish as real ones do
	// (rank 0's NCCL id, every rank's IPC record; the symmetric pool's:
	// TestLastLeaverForgetsPeersDeviceKeys, and tests/proof
	// TestClosedGroupKeysGPU on GPUs).
	t.Run("fake gpu", func(t *testing.T) {
		st := storetest.NewKeyStore(rendezvous.NewMemStore())
		for round := 0; round < 2; round++ {
			devs := []*fakeDevice{{rank: 0}, {rank: 1}}
			comms, errs := newFakeComms(t, Config{}, devs, func(_ int, c *Config) { c.Store = st })
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			closeAll(t, comms)
			if left := st.Live(); len(left) > 0 {
				t.Fatalf("round %d: %d keys left after every rank closed: %q", round, len(left), left)
			}
		}
	})
}

// failSetupDevice is a fake GPU whose region set-up fails (after NCCL
// opened: a real device has then published its NCCL id).
type failSetupDevice struct{ worldDevice }

func (d failSetupDevice) setup(context.Context, string, int64, int64) ([]cuda.DevicePtr, cuda.DevicePtr, cuda.DevicePtr, error) {
	return nil, 0, 0, errors.New("fake: out of memory")
}

// A GPU New that fails in set-up, on every rank, after the device
// published keys of its own (rank 0's NCCL id) still has the last rank
// to leave forget them: the failed set-up gave no backend, so the device
// was not asked, and those keys stayed.
func TestFailedGPUSetUpForgetsDeviceKeys(t *testing.T) {
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	devs := []*fakeDevice{{rank: 0, store: st}, {rank: 1, store: st}}
	var wg sync.WaitGroup
	errs := make([]error, len(devs))
	for r := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cfg := Config{Rank: r, WorldSize: len(devs), Device: r, Store: st, Library: collectives.Library, Group: t.Name()}
			_, errs[r] = newComm(ctx, cfg, func(Config) (device, error) { return failSetupDevice{worldDevice{devs[r], len(devs)}}, nil })
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "fake: out of memory") {
			t.Fatalf("rank %d: %v; want the set-up's failure", r, err)
		}
	}
	if !devs[0].ncclOpen || !devs[0].released || !devs[1].released {
		t.Fatalf("NCCL opened %v, released %v %v; want NCCL opened and both released", devs[0].ncclOpen, devs[0].released, devs[1].released)
	}
	needForgottenDeviceKeys(t)
	if left := st.Live(); len(left) > 0 {
		t.Fatalf("%d keys left: %q", len(left), left)
	}
}

// worldHook is a store that calls hook once, after the first attempt to
// create a group's world record (a rank's New reading the record) once
// armed.
type worldHook struct {
	rendezvous.Store
	mu    sync.Mutex
	armed bool
	hook  func()
}

func (s *worldHook) CompareAndSet(ctx context.Context, key string, old, new []byte) ([]byte, bool, error) {
	cur, ok, err := s.Store.CompareAndSet(ctx, key, old, new)
	if strings.HasSuffix(key, "/world") && old == nil {
		s.mu.Lock()
		fire := s.armed
		s.armed = false
		s.mu.Unlock()
		if fire {
			s.hook()
		}
	}
	return cur, ok, err
}

// A rank that closes a group and forms it again at once, before its peer
// has closed, read the world record the peer had not yet removed and
// joined the closing formation: its peer, forming again too, joined it as
// well, and the host set-up met that formation's nonce and unlinked
// segments ("shm: no such segment"), or the ranks waited for each other
// in two formations until the deadline. Now it waits for the formation to
// go and both form a new one.
func TestReformAtOnce(t *testing.T) {
	joined := make(chan struct{})
	st := &worldHook{Store: rendezvous.NewMemStore(), hook: func() { close(joined) }}
	cfg := func(r int) Config {
		return Config{Rank: r, WorldSize: 2, Device: Host, Store: st, Library: collectives.Library, Group: "again", Timeout: 5 * time.Second}
	}
	comms := hostComms(t, st, 2, "again")
	sum := func(c *Communicator) error {
		xs := []float32{float32(c.Rank() + 1)}
		if err := AllReduceSlice(c, xs, xs, coll.Sum, Options{}); err != nil {
			return err
		}
		if xs[0] != 3 {
			return fmt.Errorf("rank %d: sum %v, want 3", c.Rank(), xs[0])
		}
		return nil
	}
	if err := errors.Join(onRanks(comms, func(_ int, c *Communicator) error { return sum(c) })...); err != nil {
		t.Fatal(err)
	}
	if err := comms[0].Close(); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	st.armed = true
	st.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	again := make([]*Communicator, 2)
	errs := make([]error, 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		again[0], errs[0] = New(ctx, cfg(0))
	}()
	<-joined // rank 0 has read the world record; rank 1 has not closed
	if err := comms[1].Close(); err != nil {
		t.Fatal(err)
	}
	again[1], errs[1] = New(ctx, cfg(1))
	<-done
	if err := errors.Join(errs...); err != nil {
		for _, c := range again {
			if c != nil {
				c.Close()
			}
		}
		t.Fatal(err)
	}
	if again[0].id == comms[0].id {
		t.Errorf("formed again under the closed formation's id %s", again[0].id)
	}
	if err := errors.Join(onRanks(again, func(_ int, c *Communicator) error { return sum(c) })...); err != nil {
		t.Error(err)
	}
	closeAll(t, again)
}

// Host ranks naming different host_shm topologies chose by different
// rules (one ran the one-shot, the other the two-shot, of one call): New
// now fails on every rank with ErrMismatch naming Config.Topology, as GPU
// ranks' set-up agreement does. A name and the empty default that resolve
// to the same rules agree.
func TestHostTopologyMismatch(t *testing.T) {
	lib := withHostTopology("host2", coll.TwoShot)
	for _, tc := range []struct {
		topos [2]string
		ok    bool
	}{{[2]string{"host", "host2"}, false}, {[2]string{"", "host2"}, false}, {[2]string{"", "host"}, true}} {
		var wg sync.WaitGroup
		st := rendezvous.NewMemStore()
		comms := make([]*Communicator, 2)
		errs := make([]error, 2)
		for r := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				comms[r], errs[r] = New(ctx, Config{Rank: r, WorldSize: 2, Device: Host, Store: st, Library: lib,
					Group: "topo", Topology: tc.topos[r], Timeout: 2 * time.Second})
			}()
		}
		wg.Wait()
		if tc.ok {
			if err := errors.Join(errs...); err != nil {
				t.Errorf("Topology %q: %v", tc.topos, err)
			}
		} else {
			for r, err := range errs {
				if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "Config.Topology") {
					t.Errorf("Topology %q: rank %d: %v; want ErrMismatch naming Config.Topology", tc.topos, r, err)
				}
			}
		}
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	}
}
