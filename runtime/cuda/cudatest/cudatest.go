//go:build cgo

// Package cudatest holds helpers for GPU tests of the runtime packages:
// device discovery that skips cleanly on machines without CUDA, and a
// store barrier. Stores come from package rendezvous (NewMemStore for
// goroutine ranks, NewFileStore for ranks in separate processes).
package cudatest

import (
	"context"
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
