//go:build cgo

package alloc_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/alloc"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
)

// TestCUDA drives the allocator on a real device: blocks are usable device
// memory, a block used on a second stream waits for that stream's event,
// and EmptyCache gives every segment back.
func TestCUDA(t *testing.T) {
	dev := cudatest.Devices(t, 1)[0]
	a, err := alloc.NewCUDA(dev, alloc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s1, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Destroy()
	s2, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Destroy()
	b, err := a.Alloc(3<<20, s1)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Memset8Async(b.Ptr(), 7, int(b.Size()), s1); err != nil {
		t.Fatal(err)
	}
	if err := a.RecordStream(b, s2); err != nil {
		t.Fatal(err)
	}
	if err := dev.Memset8Async(b.Ptr(), 9, int(b.Size()), s2); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	c, err := a.Alloc(3<<20, s1) // reused once s2's event passed, else a new segment
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 16)
	s2.Synchronize()
	if err := dev.CopyDtoH(got, b.Ptr()); err != nil {
		t.Fatal(err)
	}
	if got[0] != 9 {
		t.Errorf("byte 0 = %d, want 9 (s2's write)", got[0])
	}
	a.Free(c)
	if err := a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if s := a.Stats(); s.Segments != 0 || s.ReservedBytes != 0 || s.NumSegmentAllocs != s.NumSegmentFrees {
		t.Errorf("after EmptyCache: %+v", s)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNewCUDANilDevice (no GPU needed): NewCUDA refuses a nil device with
// ErrInvalidArgument. (Before, it made an allocator whose first Alloc
// panicked with a nil dereference.)
func TestNewCUDANilDevice(t *testing.T) {
	a, err := alloc.NewCUDA(nil, alloc.Options{})
	if !errors.Is(err, alloc.ErrInvalidArgument) {
		t.Errorf("NewCUDA(nil): %v; want ErrInvalidArgument", err)
	}
	if a != nil {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Alloc on NewCUDA(nil)'s allocator panicked: %v", r)
				}
			}()
			a.Alloc(4096, nil)
		}()
	}
}

// TestCUDADriverWithoutDevice: a CUDADriver without a device, used
// directly rather than through NewCUDA (which refuses a nil device), is
// refused by New with ErrInvalidArgument, by value and by pointer (also a
// nil *CUDADriver). Before, New took it and the first Alloc dereferenced
// the nil *cuda.Device: a panic. Runs without a GPU.
func TestCUDADriverWithoutDevice(t *testing.T) {
	for name, drv := range map[string]alloc.Driver{
		"value":       alloc.CUDADriver{},
		"pointer":     &alloc.CUDADriver{},
		"nil pointer": (*alloc.CUDADriver)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			var a *alloc.Allocator
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				if a, err = alloc.New(drv, alloc.Options{}); err == nil {
					_, err = a.Alloc(1024, nil)
				}
			}()
			if a != nil || !errors.Is(err, alloc.ErrInvalidArgument) || !strings.Contains(err.Error(), "no device") {
				t.Fatalf("New(%#v): %v, %v; want ErrInvalidArgument saying the driver has no device", drv, a, err)
			}
		})
	}
}
