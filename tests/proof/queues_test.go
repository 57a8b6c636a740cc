package proof

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

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
// (runtime/cuda sets the variable before cuInit), and two goroutine ranks
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
	if !queuesSetAtStart && (cuda.WorkQueues() != cuda.MaxWorkQueues || os.Getenv(cuda.EnvMaxConnections) != "32") {
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
