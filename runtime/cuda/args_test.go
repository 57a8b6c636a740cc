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
