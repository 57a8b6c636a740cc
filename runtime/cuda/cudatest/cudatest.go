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

// Devices opens n devices (ordinals 0..n-1) and registers their Close with
// t.Cleanup. It skips the test, with the reason, when libcuda cannot be
// loaded or fewer than n devices exist.
func Devices(t testing.TB, n int) []*cuda.Device {
	t.Helper()
	count, err := cuda.DeviceCount()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if count < n {
		t.Skipf("test needs %d CUDA device(s), found %d", n, count)
	}
	devs := make([]*cuda.Device, n)
	for i := range devs {
		d, err := cuda.Open(i)
		if err != nil {
			t.Fatalf("open device %d: %v", i, err)
		}
		t.Cleanup(func() { d.Close() })
		devs[i] = d
	}
	return devs
}

// WorldEnv names the environment variable that sets how many GPUs the
// multi-GPU tests use (World); unset, they use every visible GPU.
const WorldEnv = "COLLGEN_TEST_WORLD"

// World opens the devices of a multi-GPU test: ordinals 0..w-1, where w
// is WorldSize's.
func World(t testing.TB, min int) []*cuda.Device {
	t.Helper()
	return Devices(t, WorldSize(t, min))
}

// WorldSize is how many GPUs a multi-GPU test uses: $COLLGEN_TEST_WORLD
// if set, else every visible device. It skips the test when fewer than
// min devices exist (or $COLLGEN_TEST_WORLD asks for more than exist) and
// fails it when $COLLGEN_TEST_WORLD is not a number of at least min, so a
// 4-GPU machine runs the tests at world 4 and a 2-GPU one at world 2 with
// no change to the command.
func WorldSize(t testing.TB, min int) int {
	t.Helper()
	count, err := cuda.DeviceCount()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	w, err := worldSize(os.Getenv(WorldEnv), count, min)
	if err != nil {
		t.Fatal(err)
	}
	if count < w {
		t.Skipf("test needs %d CUDA device(s), found %d", w, count)
	}
	return w
}

// worldSize is World's choice: env (the variable's value, "" when unset)
// or count devices, never below min.
func worldSize(env string, count, min int) (int, error) {
	if env == "" {
		return max(count, min), nil
	}
	w, err := strconv.Atoi(env)
	if err != nil || w < min {
		return 0, fmt.Errorf("%s=%q: want a number of GPUs, at least %d", WorldEnv, env, min)
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
