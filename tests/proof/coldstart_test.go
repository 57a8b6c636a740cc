package proof

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// coldWorld is $COLDSTART_WORLD, else 2.
func coldWorld(t *testing.T) int {
	w, err := strconv.Atoi(os.Getenv("COLDSTART_WORLD"))
	if err != nil || w < 1 {
		w = 2
	}
	if n := gpus(t); n < w {
		t.Skipf("world %d needs %d GPUs, this machine has %d", w, w, n)
	}
	return w
}

// kernelsOfWorld counts the library's kernels of world size w and the
// programs (sources) that run them: what New compiles.
func kernelsOfWorld(w int) (kernels, programs int) {
	sources := map[string]bool{}
	for _, k := range collectives.Library.Kernels {
		if k.World == w {
			kernels++
			sources[k.Source] = true
		}
	}
	return kernels, len(sources)
}

// TestColdStart times New to ready (every kernel of the world compiled or
// loaded; Config.LazyKernels off) with goroutine ranks: on an empty NVRTC
// cache (ranks share the compiles through the cache's lock files), then on
// the cache the first New filled, which must compile nothing. It logs
// "coldstart: ..." lines; the targets are cold <= 3 s, warm <= 20 ms.
// Opt-in (COLDSTART=1): tests/gpu/coldstart.sh runs it.
func TestColdStart(t *testing.T) {
	if os.Getenv("COLDSTART") != "1" {
		t.Skip("set COLDSTART=1 (tests/gpu/coldstart.sh)")
	}
	w := coldWorld(t)
	cache := &cuda.Cache{Dir: t.TempDir()}
	nk, np := kernelsOfWorld(w)
	for _, phase := range []string{"cold", "warm"} {
		before := cache.Stats()
		t0 := time.Now()
		comms := newComms(t, w, comm.Config{Library: collectives.Library, DisableNCCL: true, Cache: cache, Group: "coldstart-" + phase})
		el := time.Since(t0)
		if err := closeComms(comms); err != nil {
			t.Fatal(err)
		}
		st := cache.Stats()
		hits, misses := st.Hits-before.Hits, st.Misses-before.Misses
		t.Logf("coldstart: goroutine ranks, world %d, %d kernels in %d programs per rank, %s cache: New to ready %v (cache hits %d, misses %d)",
			w, nk, np, phase, el.Round(time.Millisecond), hits, misses)
		if phase == "warm" && (misses != 0 || hits != int64(w*np)) {
			t.Errorf("warm New: %d cache misses and %d hits, want 0 and %d (nothing compiled again)", misses, hits, w*np)
		}
	}
}

// TestColdStartProcess is one rank of the process-per-GPU cold start,
// started by tests/gpu/coldstart.sh through `collgen run`: it times New
// to ready over $COLLGEN_CACHE_DIR (the script empties it for the cold
// run and keeps it for the warm one) and logs one "coldstart:" line.
func TestColdStartProcess(t *testing.T) {
	if os.Getenv("COLLGEN_RANK") == "" || os.Getenv("COLDSTART") != "1" {
		t.Skip("run through tests/gpu/coldstart.sh")
	}
	gpus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, store, err := rendezvous.FromEnv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := cuda.DefaultCache()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	cm, err := comm.New(ctx, comm.Config{Rank: env.Rank, WorldSize: env.WorldSize, Device: env.LocalRank, Store: store,
		Library: collectives.Library, DisableNCCL: true, Cache: cache, Group: "coldstart-proc"})
	if err != nil {
		t.Fatal(err)
	}
	el := time.Since(t0)
	defer cm.Close()
	st := cache.Stats()
	nk, np := kernelsOfWorld(env.WorldSize)
	fmt.Printf("coldstart: process rank %d of %d, %d kernels in %d programs, %s: New to ready %v (cache hits %d, misses %d)\n",
		env.Rank, env.WorldSize, nk, np, os.Getenv("COLDSTART_PHASE"), el.Round(time.Millisecond), st.Hits, st.Misses)
}

// TestFatbinWithoutDeviceArch: New with a fatbin that has no code for the
// device fails on every rank with ErrUnsupported and a *cuda.FatbinError
// naming what the fatbin holds; it does not fall back to NVRTC.
func TestFatbinWithoutDeviceArch(t *testing.T) {
	if gpus(t) < 2 {
		t.Skip("needs 2 GPUs")
	}
	var path string
	for _, p := range []string{"runtime/cuda/testdata/tiny_sm80.fatbin", "../../runtime/cuda/testdata/tiny_sm80.fatbin"} {
		if _, err := os.Stat(p); err == nil {
			path = p
		}
	}
	if path == "" {
		t.Skip("runtime/cuda/testdata/tiny_sm80.fatbin not found (run from the repository root)")
	}
	if d, err := cuda.Open(0); err != nil {
		t.Fatal(err)
	} else if d.Close(); d.Major == 8 {
		t.Skip("sm_8x device: the test fatbin's sm_80 code runs here")
	}
	store := rendezvous.NewMemStore()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cm, err := comm.New(ctx, comm.Config{Rank: r, WorldSize: 2, Device: r, Store: store, Library: collectives.Library,
				DisableNCCL: true, FatbinPath: path, Group: "fatbin-mismatch"})
			if err == nil {
				cm.Close()
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for r, err := range errs {
		var fe *cuda.FatbinError
		if !errors.Is(err, comm.ErrUnsupported) || !errors.As(err, &fe) {
			t.Fatalf("rank %d: New = %v; want ErrUnsupported with a *cuda.FatbinError", r, err)
		}
		t.Logf("rank %d: %v", r, err)
	}
}

// TestFatbinLacksKernel: a fatbin built from only some programs (one of an
// older or other library) fails the first call of a kernel it lacks with
// a KernelError that names the fatbin and says to rebuild it. The fatbin
// comes from $COLLGEN_TEST_PARTIAL_FATBIN: `collgen fatbin --only
// 'allreduce_oneshot_ll_*_w2'` (the LL one-shots of world 2 only).
func TestFatbinLacksKernel(t *testing.T) {
	path := os.Getenv("COLLGEN_TEST_PARTIAL_FATBIN")
	if path == "" {
		t.Skip("set COLLGEN_TEST_PARTIAL_FATBIN to a fatbin of allreduce_oneshot_ll_*_w2 only (collgen fatbin --only)")
	}
	proofGPUs(t)
	// Ranks sharing a GPU load every kernel at New (a first load may
	// synchronize the shared context): New fails there, naming the fatbin.
	// With a GPU each, kernels load on first use: the call fails.
	named := func(err error) bool {
		var ke *comm.KernelError
		return errors.As(err, &ke) && strings.Contains(err.Error(), "lacks") && strings.Contains(err.Error(), path)
	}
	store := rendezvous.NewMemStore()
	comms := make([]*comm.Communicator, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := comm.Config{Rank: r, WorldSize: 2, Store: store, Library: collectives.Library, DisableNCCL: true,
				FatbinPath: path, LazyKernels: true, Group: "partial-fatbin", Timeout: 5 * time.Second}
			place(&cfg, r)
			comms[r], errs[r] = comm.New(ctx, cfg)
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		for r, err := range errs {
			if !named(err) {
				t.Errorf("rank %d: New with a fatbin lacking kernels: %v; want a KernelError naming the fatbin", r, err)
			}
			if comms[r] != nil {
				comms[r].Close()
			}
		}
		t.Logf("New: %v", errs[0])
		return
	}
	defer closeComms(comms)
	// The LL one-shot is in the fatbin: it runs.
	if err := checkedAllReduce(comms, coll.OneShotLL, "f32", 1024, 1); err != nil {
		t.Fatalf("a kernel the fatbin holds: %v", err)
	}
	// The two-shot is not: every rank's call fails before any launch.
	err := ranks(comms, func(r int, c *comm.Communicator) error {
		dev := c.Device()
		buf, err := dev.Alloc(4096) // not deviceMem: t.Fatal belongs to the test's goroutine
		if err != nil {
			return err
		}
		defer dev.Free(buf)
		b := comm.DeviceBuffer(buf)
		err = c.AllReduce(b, b, 1024, "f32", "sum", comm.Options{Algorithm: coll.TwoShot})
		if !named(err) {
			return fmt.Errorf("rank %d: two-shot from a fatbin without it: %v; want a KernelError naming the fatbin", r, err)
		}
		t.Logf("rank %d: %v", r, err)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
