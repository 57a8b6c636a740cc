//go:build cgo

package comm

import (
	"context"
	"errors"
	"fmt"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/nccl"
)

// cudaHier is the hierarchical backend's device over runtime/cuda and
// runtime/nccl. release frees, in reverse order of creation: the all-rank
// and cross NCCL communicators, Alloc's buffers, the scratch buffer, the
// stream and the device reference.
type cudaHier struct {
	cfg        Config
	dev        *cuda.Device // nil once released
	handle     *cuda.Device // dev, kept after release for Communicator.Device
	own        *cuda.Stream
	cross, all *nccl.Comm
	tmp        cuda.DevicePtr
	tmpBytes   int64
	allocs     []cuda.DevicePtr
}

// openHierDevice opens Config.Device and a stream for the hierarchical
// backend (the nested host communicator opens its own reference).
func openHierDevice(cfg Config) (hierDevice, error) {
	dev, own, err := openGPU(cfg, "")
	if err != nil {
		return nil, err
	}
	return &cudaHier{cfg: cfg, dev: dev, handle: dev, own: own}, nil
}

func (d *cudaHier) openNCCL(ctx context.Context, crossKey string, crossRank, crossWorld int, globalKey string, rank, world int) (err error) {
	if d.cross, err = nccl.NewComm(ctx, d.cfg.Store, crossKey, crossRank, crossWorld, d.dev); err != nil {
		return err
	}
	d.all, err = nccl.NewComm(ctx, d.cfg.Store, globalKey, rank, world, d.dev)
	return err
}

func (d *cudaHier) nccl(cross bool, collective coll.Collective, in, out cuda.DevicePtr, count int64, dtype coll.DType, op coll.Op, s *cuda.Stream) error {
	c := d.all
	if cross {
		c = d.cross
	}
	return ncclCall(c, collective, in, out, count, dtype, op, s)
}

func (d *cudaHier) copy(dst, src cuda.DevicePtr, bytes int64, s *cuda.Stream) error {
	return d.dev.CopyDtoDAsync(dst, src, int(bytes), s)
}

func (d *cudaHier) scratch(bytes int64) (cuda.DevicePtr, error) {
	if bytes <= d.tmpBytes {
		return d.tmp, nil
	}
	if d.tmp != 0 {
		// Enqueued steps may still use the old buffer.
		if err := d.dev.Synchronize(); err != nil {
			return 0, err
		}
		if err := d.dev.Free(d.tmp); err != nil {
			return 0, err
		}
		d.tmp, d.tmpBytes = 0, 0
	}
	p, err := d.dev.Alloc(int(bytes))
	if err != nil {
		return 0, err
	}
	d.tmp, d.tmpBytes = p, bytes
	return p, nil
}

func (d *cudaHier) alloc(bytes int) (cuda.DevicePtr, error) {
	p, err := d.dev.Alloc(bytes)
	if err != nil {
		return 0, fmt.Errorf("comm: rank %d: alloc %d bytes: %w", d.cfg.Rank, bytes, err)
	}
	d.allocs = append(d.allocs, p)
	return p, nil
}

func (d *cudaHier) synchronize(s *cuda.Stream) error {
	if s == nil {
		s = d.own
	}
	if s == nil {
		return nil
	}
	return s.Synchronize()
}

func (d *cudaHier) ncclError() error {
	var errs []error
	for _, c := range []*nccl.Comm{d.cross, d.all} {
		if c != nil {
			errs = append(errs, c.AsyncError())
		}
	}
	return errors.Join(errs...)
}

func (d *cudaHier) cudaDevice() *cuda.Device { return d.handle }

func (d *cudaHier) stream() *cuda.Stream { return d.own }

func (d *cudaHier) release() error {
	var errs []error
	for _, c := range []**nccl.Comm{&d.all, &d.cross} {
		if *c != nil {
			errs = append(errs, (*c).Close())
			*c = nil
		}
	}
	if d.dev == nil {
		return errors.Join(errs...)
	}
	for _, p := range d.allocs {
		errs = append(errs, d.dev.Free(p))
	}
	d.allocs = nil
	if d.tmp != 0 {
		errs = append(errs, d.dev.Free(d.tmp))
		d.tmp, d.tmpBytes = 0, 0
	}
	if d.own != nil {
		errs = append(errs, d.own.Destroy())
		d.own = nil
	}
	errs = append(errs, d.dev.Close())
	d.dev = nil
	return errors.Join(errs...)
}
