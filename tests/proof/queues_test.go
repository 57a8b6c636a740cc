package proof

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// envQueuesChild marks TestWorkQueuesGPU's child process, which runs
// with CUDA_DEVICE_MAX_CONNECTIONS=2.
const envQueuesChild = "COLLGEN_TEST_QUEUES_CHILD"

// queuesSetAtStart is whether the process started with
// CUDA_DEVICE_MAX_CONNECTIONS set (runtime/cuda sets it when unset).
var _, queuesSetAtStart = os.LookupEnv(cuda.EnvMaxConnections)

// TestWorkQueuesGPU (reliability case 34): a process that did not set
// CUDA_DEVICE_MAX_CONNECTIONS gets 32 hardware work queues per context
// (runtime/cuda sets the variable before cuInit; under MPS it keeps CUDA's
// 8, reliability case 36), and two goroutine ranks
// on one GPU in a process started with 2 are refused by New on both
// ranks with ErrUnsupported naming the variable: with two queues their
// graphs of several collectives deadlocked until Config.Timeout
// (TestProofWindows, the two-shot at world 4, 2026-11-23).
func TestWorkQueuesGPU(t *testing.T) {
	atLeast(t, 1)
	if os.Getenv(envQueuesChild) != "" {
		queuesChild(t)
		return
	}
	if err := cuda.Init(); err != nil {
		t.Fatal(err)
	}
	switch {
	case queuesSetAtStart:
	case cuda.UnderMPS():
		// MPS clients share one pool of queues: the variable stays unset
		// (reliability case 36).
		if _, set := os.LookupEnv(cuda.EnvMaxConnections); set || cuda.WorkQueues() != 8 {
			t.Fatalf("under MPS, started without %s: WorkQueues() = %d, the variable %q; want CUDA's 8, unset", cuda.EnvMaxConnections, cuda.WorkQueues(), os.Getenv(cuda.EnvMaxConnections))
		}
		t.Log("under MPS: contexts keep CUDA's 8 work queues")
	case cuda.WorkQueues() != cuda.MaxWorkQueues || os.Getenv(cuda.EnvMaxConnections) != "32":
		t.Fatalf("started without %s: WorkQueues() = %d, the variable %q; want 32 and \"32\"", cuda.EnvMaxConnections, cuda.WorkQueues(), os.Getenv(cuda.EnvMaxConnections))
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestWorkQueuesGPU$", "-test.v")
	cmd.Env = append(os.Environ(), envQueuesChild+"=1", cuda.EnvMaxConnections+"=2")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestWorkQueuesGPU") {
		t.Fatalf("child with %s=2: %v\n%s", cuda.EnvMaxConnections, err, out)
	}
}

// queuesChild forms two goroutine ranks on GPU 0 and expects both to be
// refused.
func queuesChild(t *testing.T) {
	if err := cuda.Init(); err != nil {
		t.Fatal(err)
	}
	if cuda.WorkQueues() != 2 {
		t.Fatalf("WorkQueues() = %d with %s=2", cuda.WorkQueues(), cuda.EnvMaxConnections)
	}
	store := rendezvous.NewMemStore()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := comm.New(ctx, comm.Config{Library: collectives.Library, Rank: r, WorldSize: 2, Store: store, Device: 0, DisableNCCL: true})
			if err == nil {
				c.Abort()
				err = errors.New("New succeeded")
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, comm.ErrUnsupported) || !strings.Contains(err.Error(), cuda.EnvMaxConnections+"=32") {
			t.Errorf("rank %d: New = %v; want ErrUnsupported naming %s=32", r, err, cuda.EnvMaxConnections)
		}
	}
}

// abortLaunches are TestAbortQueuesGPU's launch modes: early (sm_90's
// default) only. With plain launches (before sm_90, or
// Config.NoEarlyLaunch) and one work queue, Abort's write of the abort
// word waits behind the queued kernels, which leave at their timeout
// (19.5 s after Abort on one H100: reliability case 35, open);
// tests/gpu/patches/abort-zc.patch, the fix owed its proof on 2 x H200,
// adds "plain". COLLGEN_TEST_ABORTQ_PLAIN=1 set for the test makes every
// case plain.
var abortLaunches = []string{"early"}

// Markers of TestAbortQueuesGPU's child processes: the file store's
// directory, the child's rank and the algorithm.
const (
	envAbortQDir  = "COLLGEN_TEST_ABORTQ_DIR"
	envAbortQRank = "COLLGEN_TEST_ABORTQ_RANK"
	envAbortQAlg  = "COLLGEN_TEST_ABORTQ_ALG"
	// envAbortQPlain, set to anything, launches plainly (Config.NoEarlyLaunch).
	envAbortQPlain = "COLLGEN_TEST_ABORTQ_PLAIN"
)

// TestAbortQueuesGPU: two process ranks; after a first all-reduce
// together, rank 1 stops calling and rank 0 enqueues three all-reduces on
// one stream, whose first kernel waits for rank 1; then rank 0 calls
// Abort, which raises the abort word, and the stream must drain long
// before Config.Timeout: every kernel leaves at once. Run with the
// contexts' hardware work queues at 32 (runtime/cuda's default), 8 and 1
// (CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron-style programs set it),
// where every stream of the context shares one queue, each with the
// launch modes of abortLaunches.
func TestAbortQueuesGPU(t *testing.T) {
	if os.Getenv(envAbortQDir) != "" {
		abortQueuesChild(t)
		return
	}
	atLeast(t, 1)
	if !sharedGPU() {
		gpus(t)
	}
	for _, queues := range []string{"32", "8", "1"} {
		for _, launch := range abortLaunches {
			for _, alg := range []coll.Algorithm{coll.OneShot, coll.OneShotLL} {
				t.Run(fmt.Sprintf("queues=%s/%s/%s", queues, launch, alg), func(t *testing.T) {
					abortQueues(t, queues, launch == "plain", alg)
				})
			}
		}
	}
}

// abortQueues runs TestAbortQueuesGPU's two child processes with the
// given work queues, launch mode (plain: Config.NoEarlyLaunch) and
// algorithm, and checks rank 0's result.
func abortQueues(t *testing.T, queues string, plain bool, alg coll.Algorithm) {
	dir := t.TempDir()
	outs := make([]bytes.Buffer, 2)
	cmds := make([]*exec.Cmd, 2)
	for r := range cmds {
		cmds[r] = exec.Command(os.Args[0], "-test.run", "^TestAbortQueuesGPU$", "-test.v")
		cmds[r].Env = append(os.Environ(), envAbortQDir+"="+dir, fmt.Sprintf("%s=%d", envAbortQRank, r),
			cuda.EnvMaxConnections+"="+queues, envAbortQAlg+"="+string(alg))
		if plain {
			cmds[r].Env = append(cmds[r].Env, envAbortQPlain+"=1") // else the parent's, if set, is inherited
		}
		cmds[r].Stdout, cmds[r].Stderr = &outs[r], &outs[r]
		if err := cmds[r].Start(); err != nil {
			t.Fatal(err)
		}
	}
	err := cmds[0].Wait()
	cmds[1].Process.Kill()
	cmds[1].Wait()
	t.Logf("rank 0:\n%s", outs[0].String())
	if err != nil || !strings.Contains(outs[0].String(), "--- PASS: TestAbortQueuesGPU") {
		t.Errorf("rank 0 with %s=%s: %v; rank 1:\n%s", cuda.EnvMaxConnections, queues, err, outs[1].String())
	}
}

// abortQueuesChild is one rank of TestAbortQueuesGPU.
func abortQueuesChild(t *testing.T) {
	const timeout = 20 * time.Second
	rank, _ := strconv.Atoi(os.Getenv(envAbortQRank))
	alg := coll.Algorithm(os.Getenv(envAbortQAlg))
	store, err := rendezvous.NewFileStore(os.Getenv(envAbortQDir))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := cuda.Init(); err != nil {
		t.Fatal(err)
	}
	t.Logf("rank %d: %d work queues", rank, cuda.WorkQueues())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := comm.Config{Rank: rank, WorldSize: 2, Store: store, Library: collectives.Library, Group: "abort-queues",
		Timeout: timeout, DisableNCCL: true, LazyKernels: true, NoEarlyLaunch: os.Getenv(envAbortQPlain) != ""}
	place(&cfg, rank)
	c, err := comm.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := c.Device()
	const n = 1 << 14
	buf, err := d.Alloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	b := comm.DeviceBuffer(buf)
	if err := c.AllReduce(b, b, n, coll.F32, coll.Sum, comm.Options{Algorithm: alg}); err != nil {
		t.Fatal(err)
	}
	if err := c.Synchronize(nil); err != nil {
		t.Fatal(err)
	}
	if rank == 1 {
		time.Sleep(2 * time.Minute) // the parent kills it once rank 0 is done
		return
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := c.AllReduce(b, b, n, coll.F32, coll.Sum, comm.Options{Algorithm: alg, Stream: s}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if done, err := s.Query(); done || err != nil {
		t.Fatalf("the stream drained before Abort (%v): rank 1 did not stay away?", err)
	}
	start := time.Now()
	if err := c.Abort(); err != nil {
		t.Logf("Abort: %v", err)
	}
	for {
		done, err := s.Query()
		if err != nil {
			t.Fatalf("stream after Abort: %v", err)
		}
		if done {
			break
		}
		if time.Since(start) > 3*timeout {
			t.Fatalf("the stream has not drained %v after Abort", time.Since(start))
		}
		time.Sleep(time.Millisecond)
	}
	el := time.Since(start)
	t.Logf("drained %v after Abort (Config.Timeout %v, %d work queues)", el, timeout, cuda.WorkQueues())
	if el > timeout/4 {
		t.Errorf("the kernels left %v after Abort, near Config.Timeout %v: Abort's abort word did not reach them", el, timeout)
	}
}
