//go:build cgo

package alloc

import (
	"fmt"

	"github.com/collgen/collgen/runtime/cuda"
)

// CUDADriver is the Driver over a real device: segments from cuMemAlloc,
// events from cuEventRecord and cuEventQuery.
type CUDADriver struct {
	Dev *cuda.Device // the device segments live on; the caller keeps it open
}

// NewCUDA makes an allocator over dev; a nil dev is refused
// (ErrInvalidArgument).
func NewCUDA(dev *cuda.Device, opts Options) (*Allocator, error) {
	if dev == nil {
		return nil, fmt.Errorf("%w: NewCUDA of a nil device: pass a device from cuda.Open", ErrInvalidArgument)
	}
	return New(CUDADriver{Dev: dev}, opts)
}

// checkDriver refuses a CUDADriver without a device (New calls it): one
// made directly, not by NewCUDA, would dereference the nil device at the
// first Alloc.
func checkDriver(drv Driver) error {
	var dev *cuda.Device
	switch d := drv.(type) {
	case CUDADriver:
		dev = d.Dev
	case *CUDADriver:
		if d != nil {
			dev = d.Dev
		}
	default:
		return nil
	}
	if dev == nil {
		return fmt.Errorf("%w: a CUDADriver with no device (Dev is nil): set Dev to a device from cuda.Open, or use NewCUDA", ErrInvalidArgument)
	}
	return nil
}

// Alloc is cuMemAlloc.
func (d CUDADriver) Alloc(bytes int64) (cuda.DevicePtr, error) { return d.Dev.Alloc(int(bytes)) }

// Free is cuMemFree.
func (d CUDADriver) Free(p cuda.DevicePtr) error { return d.Dev.Free(p) }

// Record records a new event on s.
func (d CUDADriver) Record(s *cuda.Stream) (Event, error) {
	e, err := d.Dev.NewEvent()
	if err != nil {
		return nil, err
	}
	if err := e.Record(s); err != nil {
		e.Destroy()
		return nil, err
	}
	return cudaEvent{e}, nil
}

type cudaEvent struct{ e *cuda.Event }

func (e cudaEvent) Done() (bool, error) { return e.e.Query() }
func (e cudaEvent) Wait() error         { return e.e.Synchronize() }
func (e cudaEvent) Release() error      { return e.e.Destroy() }
