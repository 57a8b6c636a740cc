//go:build cgo

package cuda

import (
	"errors"
	"math"
	"testing"
)

// TestNegativeSizesRefused: sizes the driver takes as size_t are refused
// when negative, before the driver is asked (a negative int became a
// size near 2^64 there), with ErrInvalidArgument naming the call; so is
// a negative or oversized dynamic shared memory size. No GPU needed: the
// device is never entered.
func TestNegativeSizesRefused(t *testing.T) {
	d := &Device{Ordinal: 3}
	f := &Function{Name: "k", mod: &Module{dev: d}}
	for name, call := range map[string]func() error{
		"Memset8":           func() error { return d.Memset8(0, 0, -1) },
		"MemsetD32":         func() error { return d.MemsetD32(0, 0, -4) },
		"Memset8Async":      func() error { return d.Memset8Async(0, 0, math.MinInt, nil) },
		"MemsetD32Async":    func() error { return d.MemsetD32Async(0, 0, -1, nil) },
		"CopyDtoD":          func() error { return d.CopyDtoD(0, 0, -1) },
		"CopyDtoDAsync":     func() error { return d.CopyDtoDAsync(0, 0, -1, nil) },
		"Alloc":             func() error { _, err := d.Alloc(-1); return err },
		"HostAlloc":         func() error { _, err := d.HostAlloc(0, false); return err },
		"MemAddressReserve": func() error { _, err := d.MemAddressReserve(-1, 0); return err },
		"MemAddressFree":    func() error { return d.MemAddressFree(0, -1) },
		"MemCreate":         func() error { _, err := d.MemCreate(-1); return err },
		"MemMap":            func() error { return d.MemMap(0, -1, 0) },
		"MemUnmap":          func() error { return d.MemUnmap(0, -1) },
		"MemSetAccess":      func() error { return d.MemSetAccess(0, -1, d) },
		"MemSetAccess nil":  func() error { return d.MemSetAccess(0, 1, nil) },
		"Launch shared":     func() error { return f.Launch(Dim3(1), Dim3(32), -1, nil, nil) },
		"Launch shared big": func() error { return f.Launch(Dim3(1), Dim3(32), math.MaxUint32+1, nil, nil) },
	} {
		if err := call(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestUseAfterDestroyRefused: a destroyed stream's handle is 0, the
// legacy default stream to CUDA, so work meant for it ran there and its
// waits waited for other work; a Function of an unloaded module named
// freed driver state. Both are refused now, with ErrInvalidArgument,
// before the device is entered (no GPU needed; TestUseAfterDestroyGPU
// in cuda_test.go does it with real handles).
func TestUseAfterDestroyRefused(t *testing.T) {
	d := &Device{Ordinal: 1}
	st := &Stream{dev: d} // as Destroy leaves it
	m := &Module{dev: d, funcs: map[string]*Function{}}
	f := &Function{Name: "k", mod: m}
	for name, call := range map[string]func() error{
		"Synchronize":    st.Synchronize,
		"Query":          func() error { _, err := st.Query(); return err },
		"WaitEvent":      func() error { return st.WaitEvent(&Event{dev: d}) },
		"BeginCapture":   st.BeginCapture,
		"EndCapture":     func() error { _, err := st.EndCapture(); return err },
		"Memset8Async":   func() error { return d.Memset8Async(0, 0, 4, st) },
		"MemsetD32Async": func() error { return d.MemsetD32Async(0, 0, 1, st) },
		"CopyDtoDAsync":  func() error { return d.CopyDtoDAsync(0, 0, 4, st) },
		"GraphLaunch":    func() error { return (&GraphExec{dev: d}).Launch(st) },
		"EventRecord":    func() error { return (&Event{dev: d}).Record(st) },
		"Launch unloaded": func() error {
			return f.Launch(Dim3(1), Dim3(32), 0, nil, nil)
		},
		"Function unloaded": func() error { _, err := m.Function("k"); return err },
	} {
		if err := call(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
}
