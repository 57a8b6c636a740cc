//go:build !cgo

package cuda

import (
	"context"
	"errors"
)

// ErrNoCgo is returned by everything that would reach CUDA in a program
// built with CGO_ENABLED=0: the driver, NVRTC and modules are reached
// through cgo shims. The types stay, so CPU-only programs that name them
// (through runtime/comm's API) still build.
var ErrNoCgo = errors.New("cuda: this program was built with CGO_ENABLED=0; CUDA needs cgo (build with CGO_ENABLED=1 and a C compiler)")

// Device is a CUDA device; without cgo none can be opened.
type Device struct {
	Ordinal  int    // CUDA ordinal in this process
	Name     string // e.g. "NVIDIA H200"
	Major    int    // compute capability major
	Minor    int    // compute capability minor
	SMCount  int    // streaming multiprocessors
	TotalMem uint64 // bytes of device memory
	PCIBusID string // "0000:18:00.0", stable across processes
}

// Stream is a CUDA stream; without cgo none can be created.
type Stream struct{}

// DeviceCount returns ErrNoCgo.
func DeviceCount() (int, error) { return 0, ErrNoCgo }

// WorkQueues returns 0: without cgo no driver is loaded.
func WorkQueues() int { return 0 }

// UnderMPS is false: this build has no CUDA driver.
func UnderMPS() bool { return false }

// Open returns ErrNoCgo.
func Open(ordinal int) (*Device, error) { return nil, ErrNoCgo }

// NVRTCVersion returns ErrNoCgo (the cache key then cannot be computed, so
// nothing is cached).
func NVRTCVersion() (major, minor int, path string, err error) { return 0, 0, "", ErrNoCgo }

// nvrtcCompiler returns ErrNoCgo (nothing is cached).
func nvrtcCompiler() (string, error) { return "", ErrNoCgo }

// Compile returns ErrNoCgo.
func Compile(ctx context.Context, req CompileRequest) ([]byte, error) { return nil, ErrNoCgo }
