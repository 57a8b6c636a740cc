package nccl

/*
#include "nccl_shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/collgen/collgen/internal/pause"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// Sentinels for errors.Is.
var (
	// ErrTimeout: a non-blocking communicator's initialisation or call did
	// not finish within its bound; the communicator was aborted.
	ErrTimeout = errors.New("nccl: timeout")
	// ErrAborted: the communicator was aborted (Abort, or after a
	// timeout).
	ErrAborted = errors.New("nccl: communicator aborted")
)

// since names the NCCL release that introduced each symbol collgen may
// use, for the error when the loaded library lacks one.
var since = map[string]string{
	"ncclCommAbort":            "2.4",
	"ncclCommGetAsyncError":    "2.4",
	"ncclCommInitRankConfig":   "2.14",
	"ncclGetLastError":         "2.13",
	"ncclCommRegister":         "2.19",
	"ncclCommDeregister":       "2.19",
	"ncclMemAlloc":             "2.19",
	"ncclMemFree":              "2.19",
	"ncclCommWindowRegister":   "2.27",
	"ncclCommWindowDeregister": "2.27",
}

// missingMsg says which symbol is missing and which NCCL has it.
func missingMsg(sym string) string {
	msg := fmt.Sprintf("symbol %s not found in libnccl", sym)
	if v, ok := since[sym]; ok {
		if loaded != nil {
			msg += fmt.Sprintf(" %v", loaded.Version())
		}
		msg += fmt.Sprintf(" (%s needs NCCL %s or newer)", sym, v)
	}
	return msg
}

// Config tunes NewCommConfig.
type Config struct {
	// Timeout bounds every wait on the communicator after it is made:
	// an operation NCCL has not finished (a collective whose connection
	// set-up waits for a peer, a window registration). Past it the
	// communicator is aborted and the call returns an error wrapping
	// ErrTimeout. 0 means DefaultTimeout.
	Timeout time.Duration
}

// DefaultTimeout is Config.Timeout's default, and the bound of every wait
// on a Comm made by NewComm.
const DefaultTimeout = time.Minute

// Pacing of wait's polls (pause.Backoff): it asks NCCL again at once
// (yielding the processor) for spinFor, since NCCL's background thread
// finishes an enqueue within microseconds, then sleeps between polls, 10
// µs doubling up to pollInterval (time.Sleep would last a millisecond
// however short: sleeps of 200 µs made every eager non-blocking call at
// world 2 take 1.1 ms on 2 x H200).
const (
	spinFor      = 100 * time.Microsecond
	pollInterval = 200 * time.Microsecond
)

// NewCommConfig is NewComm for a non-blocking communicator
// (ncclCommInitRankConfig with blocking = 0, NCCL 2.14+): initialisation
// is bounded by ctx, and every later call by cfg.Timeout, so no wait on
// NCCL can hang; on either bound the communicator is aborted. Rank 0's id
// travels through store as in NewComm.
func NewCommConfig(ctx context.Context, store rendezvous.Store, key string, rank, world int, dev *cuda.Device, cfg Config) (*Comm, error) {
	lib, id, err := agreeID(ctx, store, key, rank, world)
	if err != nil {
		return nil, err
	}
	cm := newComm(lib, dev, rank, world, true, cfg.Timeout)
	op := fmt.Sprintf("ncclCommInitRankConfig(world %d, device %d, non-blocking)", world, dev.Ordinal)
	var r C.ncclResult_t
	if err := dev.WithContext(func() error {
		// NCCL sets h before returning; its background thread initialises
		// the communicator h points to and never writes h itself.
		var h C.ncclComm_t
		r = C.cgn_ncclCommInitRankConfig(&h, C.int(world), unsafe.Pointer(&id[0]), C.int(rank), 0)
		cm.c = h
		return nil
	}); err != nil {
		cm.freeSlot()
		return nil, err
	}
	if cm.c == nil {
		cm.freeSlot()
		return nil, newError(r, op, rank, nil)
	}
	if r != 0 && Result(r) != InProgress {
		return nil, errors.Join(newError(r, op, rank, nil), cm.Abort())
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(100 * 365 * 24 * time.Hour)
	}
	cm.opMu.Lock()
	err = cm.wait(ctx, func() string { return op }, deadline)
	cm.opMu.Unlock()
	if err != nil {
		// A failed initialisation must be aborted too (a timeout already
		// was; Abort is idempotent).
		return nil, errors.Join(err, cm.Abort())
	}
	return cm, nil
}

// idKey is where rank 0 publishes the unique id of the communicator made
// under key.
func idKey(key string) string { return key + "/nccl-id" }

// ForgetID deletes the unique ids NewComm or NewCommConfig published
// under keys, rendezvous.KeysInFlight at a time (rendezvous.DeleteKeys).
// Call it once every rank's NewComm has returned (a rank still waiting
// for an id would wait until its deadline): comm's last rank to leave a
// group does. Deleting an absent id is not an error.
func ForgetID(ctx context.Context, store rendezvous.Store, keys ...string) error {
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = idKey(k)
	}
	return rendezvous.DeleteKeys(ctx, store, ids...)
}

// agreeID loads NCCL and shares rank 0's unique id through the store.
func agreeID(ctx context.Context, store rendezvous.Store, key string, rank, world int) (*Lib, UniqueID, error) {
	var id UniqueID
	if world <= 0 || rank < 0 || rank >= world {
		return nil, id, fmt.Errorf("nccl: rank %d out of range for world %d", rank, world)
	}
	lib, err := Load()
	if err != nil {
		return nil, id, err
	}
	idKey := idKey(key)
	if rank == 0 {
		if id, err = lib.NewUniqueID(); err != nil {
			return nil, id, err
		}
		if err := store.Set(ctx, idKey, id[:]); err != nil {
			return nil, id, fmt.Errorf("nccl: rank 0: publish id: %w", err)
		}
		return lib, id, nil
	}
	b, err := store.Get(ctx, idKey)
	if err != nil {
		return nil, id, fmt.Errorf("nccl: rank %d: waiting for rank 0's id: %w", rank, err)
	}
	if len(b) != UniqueIDSize {
		return nil, id, fmt.Errorf("nccl: rank %d: id under %q has %d bytes, want %d", rank, idKey, len(b), UniqueIDSize)
	}
	copy(id[:], b)
	return lib, id, nil
}

// wait polls ncclCommGetAsyncError (with opMu held) until the
// communicator's last operation is no longer in progress: nil when it
// succeeded, NCCL's error when it or an earlier one failed. Past
// deadline, or when ctx ends, it aborts the communicator; Abort from
// another goroutine ends it too. The read lock is held only around each
// poll (see Comm). On a blocking communicator it returns at the first
// poll.
func (c *Comm) wait(ctx context.Context, op func() string, deadline time.Time) error {
	pace := pause.Backoff{Spin: spinFor, Max: pollInterval}
	for {
		if c.aborting.Load() {
			return fmt.Errorf("nccl: %s on rank %d: %w", op(), c.rank, ErrAborted)
		}
		inProgress, err := c.poll(op)
		if err != nil {
			return err
		}
		if !inProgress {
			return nil
		}
		var why error
		switch {
		case ctx.Err() != nil:
			why = fmt.Errorf("%w (%w)", ErrTimeout, ctx.Err())
		case time.Now().After(deadline):
			why = ErrTimeout
		}
		if why != nil {
			aerr := c.Abort()
			return errors.Join(fmt.Errorf("nccl: %s on rank %d: not finished in time (a peer is dead, stalled or not calling); communicator aborted: %w", op(), c.rank, why), aerr)
		}
		pace.Wait()
	}
}
