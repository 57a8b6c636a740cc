//go:build cgo

// Package cudatest holds helpers for GPU tests of the runtime packages:
// device discovery that skips cleanly on machines without CUDA, and a
// store barrier. Stores come from package rendezvous (NewMemStore for
// goroutine ranks, NewFileStore for ranks in separate processes).
package cudatest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// EnvShare names the environment variable that, set to 1, puts every
// rank of the multi-GPU tests on GPU 0 (Shared): one GPU then runs the
// group tests at any world size. It proves the tests' and the runtime's
// logic (mappings, descriptors, signals, timeouts, clean-up) where no
// machine with a GPU per rank is at hand, not NVLink's ordering or speed.
const EnvShare = "COLLGEN_TEST_SHARE_GPU"

// Shared reports whether $COLLGEN_TEST_SHARE_GPU=1 puts every rank on
// GPU 0.
func Shared() bool { return os.Getenv(EnvShare) == "1" }

// Ordinal is the GPU of rank r: r, or 0 when ranks share one GPU. Child
// processes of a test inherit the environment, so they agree with it.
func Ordinal(r int) int {
	if Shared() {
		return 0
	}
	return r
}

// Devices opens the devices of n ranks (ordinals 0..n-1, or GPU 0 n times
// when Shared) and registers their Close with t.Cleanup. It skips the
// test, with the reason, when libcuda cannot be loaded or the devices do
// not exist.
func Devices(t testing.TB, n int) []*cuda.Device {
	t.Helper()
	count, err := cuda.DeviceCount()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if need := distinct(n); count < need {
		t.Skipf("test needs %d CUDA device(s), found %d", need, count)
	}
	devs := make([]*cuda.Device, n)
	for i := range devs {
		d, err := cuda.Open(Ordinal(i))
		if err != nil {
			t.Fatalf("open device %d: %v", i, err)
		}
		t.Cleanup(func() { d.Close() })
		devs[i] = d
	}
	return devs
}

// EnvWorld names the environment variable that sets how many GPUs the
// multi-GPU tests use (World); unset, they use every visible GPU.
const EnvWorld = "COLLGEN_TEST_WORLD"

// World opens the devices of a multi-GPU test: ordinals 0..w-1, where w
// is WorldSize's.
func World(t testing.TB, min int) []*cuda.Device {
	t.Helper()
	return Devices(t, WorldSize(t, min))
}

// WorldSize is how many ranks a multi-GPU test runs: $COLLGEN_TEST_WORLD
// if set, else every visible device (min when Shared). It skips the test
// when the GPUs are too few (fewer than min, or than $COLLGEN_TEST_WORLD
// asks for, unless Shared) and fails it when $COLLGEN_TEST_WORLD is not a
// number of at least min, so a 4-GPU machine runs the tests at world 4
// and a 2-GPU one at world 2 with no change to the command.
func WorldSize(t testing.TB, min int) int {
	t.Helper()
	count, err := cuda.DeviceCount()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	w, err := worldSize(os.Getenv(EnvWorld), count, min, Shared())
	if err != nil {
		t.Fatal(err)
	}
	if need := distinct(w); count < need {
		t.Skipf("test needs %d CUDA device(s), found %d", need, count)
	}
	return w
}

// NCCLWorld is WorldSize for tests of NCCL communicators, except that
// when ranks share one GPU it is 1: NCCL refuses two ranks on one device
// ("Duplicate GPU detected"), so a shared run proves the one-rank paths
// (communicator, registration, windows, refusals).
func NCCLWorld(t testing.TB) int {
	t.Helper()
	if Shared() {
		Devices(t, 1)
		return 1
	}
	return WorldSize(t, 2)
}

// OwnGPUs skips a test whose ranks need a GPU each (an NCCL group of two
// or more) when ranks share one GPU.
func OwnGPUs(t testing.TB) {
	t.Helper()
	if Shared() {
		t.Skipf("needs a GPU per rank (NCCL refuses two ranks on one device); %s=1 shares one", EnvShare)
	}
}

// distinct is how many GPUs n ranks occupy.
func distinct(n int) int {
	if Shared() {
		return min(n, 1)
	}
	return n
}

// worldSize is World's choice: env (the variable's value, "" when unset)
// or count devices (min when shared), never below min.
func worldSize(env string, count, min int, shared bool) (int, error) {
	if env == "" {
		if shared {
			return min, nil
		}
		return max(count, min), nil
	}
	w, err := strconv.Atoi(env)
	if err != nil || w < min {
		return 0, fmt.Errorf("%s=%q: want a number of GPUs, at least %d", EnvWorld, env, min)
	}
	return w, nil
}

// Barrier blocks until world ranks have reached the barrier called name.
func Barrier(ctx context.Context, s rendezvous.Store, name string, world int) error {
	n, err := s.Add(ctx, name+"/count", 1)
	if err != nil {
		return err
	}
	if n == int64(world) {
		if err := s.Set(ctx, name+"/done", []byte{1}); err != nil {
			return err
		}
	}
	return s.Wait(ctx, name+"/done")
}
