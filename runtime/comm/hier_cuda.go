//go:build cgo

package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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

	// aborted is set by abort: synchronize returns at once.
	aborted atomic.Bool
	// commMu orders abortNCCL, which Abort calls from any goroutine,
	// against release's clearing of cross and all.
	commMu sync.Mutex
	// ncclPending holds the streams NCCL work went on (the own one or a
	// caller's) that no synchronize has seen done: waits on them are
	// bounded, and drained waits for them with the own one (as
	// cudaDevice's).
	ncclPending pendingNCCL
	// watch bounds a wait for NCCL work (synchronize), made with the
	// communicators by openNCCL.
	watch *ncclWatch
	// syncing is closed when the cuCtxSynchronize of the last syncAll
	// has returned (nil before any): one that outlived its deadline may
	// still run, and release must not close the device under it.
	syncing chan struct{}
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
	if d.cross, err = newNCCL(ctx, d.cfg, crossKey, crossRank, crossWorld, d.dev); err != nil {
		return err
	}
	if d.all, err = newNCCL(ctx, d.cfg, globalKey, rank, world, d.dev); err != nil {
		return err
	}
	d.watch = &ncclWatch{asyncErr: d.ncclError, abort: d.abortNCCL, timeout: d.cfg.Timeout, what: "a collective across hosts (NCCL)"}
	return nil
}

func (d *cudaHier) nccl(cross bool, collective coll.Collective, in, out cuda.DevicePtr, count int64, dtype coll.DType, op coll.Op, s *cuda.Stream) error {
	c := d.all
	if cross {
		c = d.cross
	}
	if s == nil {
		s = d.own
	}
	d.ncclPending.note(s)
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
		// Steps enqueued on any stream may still use the old buffer.
		if err := d.syncAll(); err != nil {
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

// syncAll waits for all of the device's work (cuCtxSynchronize: the steps
// may be on any stream) as synchronize waits for one stream: bounded by
// Config.Timeout, after which both NCCL communicators are aborted (their
// kernels stop, and the synchronize left behind then returns), and cut
// short by abort.
func (d *cudaHier) syncAll() error {
	done, synced := make(chan error, 1), make(chan struct{})
	d.syncing = synced
	dev := d.dev
	go func() {
		done <- dev.Synchronize()
		close(synced)
	}()
	var res error
	query := func() (bool, error) {
		select {
		case res = <-done:
			return true, res
		default:
			return false, nil
		}
	}
	watch := &ncclWatch{asyncErr: d.ncclError, abort: d.abortNCCL, timeout: d.cfg.Timeout, what: "the work before a larger scratch buffer (collectives across hosts, NCCL)"}
	return waitStream(d.cfg.Rank, query, d.aborted.Load, watch)
}

func (d *cudaHier) alloc(bytes int) (cuda.DevicePtr, error) {
	p, err := d.dev.Alloc(bytes)
	if err != nil {
		return 0, fmt.Errorf("comm: rank %d: alloc %d bytes: %w", d.cfg.Rank, bytes, err)
	}
	d.allocs = append(d.allocs, p)
	return p, nil
}

// synchronize waits for s like cudaDevice.wait: where NCCL work went on s
// and no wait has seen it done, Config.Timeout bounds the wait (a dead
// host's NCCL kernels would otherwise wait forever) and NCCL's
// asynchronous error ends it, both aborting the two NCCL communicators;
// abort cuts any wait short. A stream without such work is the caller's
// to bound.
func (d *cudaHier) synchronize(s *cuda.Stream) error {
	if s == nil {
		s = d.own
	}
	if s == nil {
		return nil
	}
	return d.ncclPending.waitFor(d.cfg.Rank, s, d.aborted.Load, d.watch)
}

// abort makes synchronize return ErrAborted at once and aborts both NCCL
// communicators (ncclCommAbort: their kernels stop); release still frees
// the rest.
func (d *cudaHier) abort() {
	d.aborted.Store(true)
	d.abortNCCL()
}

// abortNCCL aborts the cross-host and all-rank NCCL communicators.
func (d *cudaHier) abortNCCL() {
	d.commMu.Lock()
	defer d.commMu.Unlock()
	for _, c := range []*nccl.Comm{d.cross, d.all} {
		if c != nil {
			c.Abort()
		}
	}
}

// drained waits up to timeout for the own stream and every stream NCCL
// work went on to finish, reporting whether they did.
func (d *cudaHier) drained(timeout time.Duration) bool {
	return drainStreams(timeout, ownAnd(d.own, d.ncclPending.all())...)
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
	d.commMu.Lock()
	for _, c := range []**nccl.Comm{&d.all, &d.cross} {
		if *c != nil {
			errs = append(errs, (*c).Close())
			*c = nil
		}
	}
	d.commMu.Unlock()
	if d.dev == nil {
		return errors.Join(errs...)
	}
	if d.syncing != nil {
		// NCCL is closed or aborted above, so its kernels end and a
		// syncAll's cuCtxSynchronize past its deadline returns; wait for
		// it, bounded, before freeing what it waits on.
		select {
		case <-d.syncing:
		case <-time.After(d.cfg.Timeout):
			return errors.Join(append(errs, errorf(ErrTimeout, "comm: rank %d: a wait for the device's work still runs %v after its deadline; the hierarchical backend's buffers and device are left", d.cfg.Rank, d.cfg.Timeout))...)
		}
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
