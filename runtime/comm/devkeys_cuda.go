//go:build cgo && linux && (amd64 || arm64)

package comm

import (
	"context"

	"github.com/collgen/collgen/runtime/ipc"
	"github.com/collgen/collgen/runtime/nccl"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/symm"
)

// forgetDeviceKeys deletes, best effort, the keys the devices of a GPU
// formation on one host may have published under prefix, whichever ranks
// published them: the NCCL id (rank 0's), every rank's IPC record and
// the pools behind Alloc. The last rank to leave calls it, from the
// formation alone: it may itself have opened no NCCL, exchanged no
// region and formed no pool (its set-up failed before, or its device did
// not open), and its device's record of the keys it used left its peers'
// behind.
func forgetDeviceKeys(ctx context.Context, st rendezvous.Store, prefix string, world int) {
	nccl.ForgetID(ctx, st, ncclKey(prefix))
	ipc.Forget(ctx, st, regionKey(prefix), world)
	symm.ForgetGroup(ctx, st, symmGroup(prefix), world)
}

// forgetHierKeys is forgetDeviceKeys for a formation spanning hosts of
// perHost ranks each: the all-rank NCCL id and every local index's
// cross-host one (the nested host communicators forget their own keys).
func forgetHierKeys(ctx context.Context, st rendezvous.Store, prefix string, perHost int) {
	keys := []string{ncclKey(prefix)}
	for me := range perHost {
		keys = append(keys, crossKey(prefix, me))
	}
	nccl.ForgetID(ctx, st, keys...)
}
