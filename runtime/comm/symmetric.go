//go:build linux && (amd64 || arm64)

package comm

import (
	"context"
	"fmt"

	"github.com/collgen/collgen/runtime/symm"
)

// symmetricUser is the device side of UseSymmetric (the CUDA device):
// checkSymmetric says whether the pool's memory is this rank's GPU's,
// addSymmetric makes its buffers zero-copy candidates.
type symmetricUser interface {
	checkSymmetric(pool *symm.Pool) error
	addSymmetric(pool *symm.Pool)
}

// useRecord is what each rank publishes in UseSymmetric.
type useRecord struct {
	Pool string `json:"pool"` // the pool instance's ID
	Err  string `json:"err"`  // why this rank cannot use it, or ""
}

// UseSymmetric lets collectives read inputs that lie in pool's buffers in
// place (zero-copy), as they do inputs in Alloc's buffers: a barrier
// kernel then reads every rank's input where it is instead of copying it
// into the staging buffer, and no staging limit applies to it. Only
// buffers a Rendezvous has mapped count, and every rank must pass
// symmetric inputs at the same offset in the same calls (see Alloc).
//
// It is collective: every rank passes the same pool instance (its own
// rank's Pool of one group, formed once), with the communicator's rank
// and world size, on this rank's GPU; otherwise every rank returns an
// error wrapping ErrMismatch or ErrInvalidArgument that names the rank and
// the reason, and nothing changes. The wait for the other ranks is
// bounded by ctx and Config.Timeout (ErrTimeout naming the ranks missing)
// and ends at once on Abort (ErrAborted). The pool stays the caller's: buffers it
// frees are simply staged again; close it after the communicator.
func (c *Communicator) UseSymmetric(ctx context.Context, pool *symm.Pool) error {
	if c.gpu == nil {
		return errorf(ErrInvalidArgument, "comm: UseSymmetric is for GPU communicators")
	}
	if pool == nil {
		return errorf(ErrInvalidArgument, "comm: UseSymmetric of a nil pool")
	}
	c.busy.Lock() // as Alloc: Close and Abort wait for it
	defer c.busy.Unlock()
	if err := c.gone("UseSymmetric"); err != nil {
		return err
	}
	user, ok := c.gpu.dev.(symmetricUser)
	var local error
	switch {
	case pool.Rank() != c.cfg.Rank || pool.WorldSize() != c.cfg.WorldSize:
		local = errorf(ErrMismatch, "comm: UseSymmetric: rank %d's pool of group %q is rank %d of %d, the communicator rank %d of %d",
			c.cfg.Rank, pool.Group(), pool.Rank(), pool.WorldSize(), c.cfg.Rank, c.cfg.WorldSize)
	case !ok:
		local = errorf(ErrUnsupported, "comm: UseSymmetric: rank %d's device cannot read symmetric memory in place", c.cfg.Rank)
	default:
		local = user.checkSymmetric(pool)
	}
	mine := useRecord{Pool: pool.ID()}
	if local != nil {
		mine.Err = local.Error()
	}
	var all []useRecord
	err := c.exchange(ctx, "UseSymmetric", func(ctx context.Context) (err error) {
		all, err = gatherJSON(ctx, c.cfg.Store, c.gpu.prefix+"usesymm", c.cfg.Rank, c.cfg.WorldSize, mine, "UseSymmetric record")
		return err
	})
	if err != nil {
		if c.gone("UseSymmetric") != nil {
			return err // Abort ended the wait
		}
		return classify(fmt.Errorf("comm: rank %d: UseSymmetric: %w", c.cfg.Rank, err))
	}
	for r, rec := range all {
		switch {
		case r == c.cfg.Rank && local != nil:
			return local
		case rec.Err != "":
			return errorf(ErrMismatch, "comm: UseSymmetric: rank %d cannot: %s", r, rec.Err)
		case rec.Pool != mine.Pool:
			return errorf(ErrMismatch, "comm: UseSymmetric: rank %d passed pool instance %s, rank %d passed %s; every rank must pass its rank's pool of one group", r, rec.Pool, c.cfg.Rank, mine.Pool)
		}
	}
	user.addSymmetric(pool)
	return nil
}
