//go:build cgo

package comm

import (
	"errors"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/nccl"
)

// ncclCall enqueues one collective on c: count is NCCL's (all-reduce:
// elements; reduce-scatter: recvCount; all-gather: sendCount). The GPU and
// hierarchical backends share it, passing call.count, which is already in
// NCCL's convention.
func ncclCall(c *nccl.Comm, collective coll.Collective, in, out cuda.DevicePtr, count int64, dtype coll.DType, op coll.Op, s *cuda.Stream) error {
	dt, ok := dtype.NCCL()
	if !ok {
		return errorf(ErrUnsupported, "comm: NCCL has no type for %s", dtype)
	}
	if d := nccl.DataType(dt); d == nccl.F8E4M3 || d == nccl.F8E5M2 {
		if why := ncclLacks((*nccl.Lib).HasFP8, "has no fp8 types (2.24+)"); why != "" {
			return errorf(ErrUnsupported, "comm: %s on %s: %s", collective, dtype, why)
		}
	}
	if collective == coll.AllGather {
		return c.AllGather(in, out, int(count), nccl.DataType(dt), s)
	}
	o, ok := op.NCCL()
	if !ok {
		return errorf(ErrUnsupported, "comm: NCCL has no op %s", op)
	}
	if collective == coll.AllReduce {
		return c.AllReduce(in, out, int(count), nccl.DataType(dt), nccl.RedOp(o), s)
	}
	return c.ReduceScatter(in, out, int(count), nccl.DataType(dt), nccl.RedOp(o), s)
}

// openGPU opens Config.Device and a stream on it for the GPU and the
// hierarchical devices; hint ends the error when the device cannot be
// used. On error nothing stays open.
func openGPU(cfg Config, hint string) (*cuda.Device, *cuda.Stream, error) {
	dev, err := cuda.Open(cfg.Device)
	if err != nil {
		return nil, nil, errorf(ErrUnsupported, "comm: rank %d: cannot use GPU %d (Config.Device): %w%s", cfg.Rank, cfg.Device, err, hint)
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, nil, errors.Join(err, dev.Close())
	}
	return dev, s, nil
}
