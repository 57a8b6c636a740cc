// Package nccl binds the few NCCL entry points collgen uses as a baseline
// and fallback: communicator setup through a rendezvous.Store, all-reduce,
// reduce-scatter, all-gather, and error handling. libnccl.so.2 is loaded
// with dlopen at run time (no NCCL headers or library are needed to build);
// a missing library is a clear error.
//
// Threading: every call runs on a locked OS thread with the communicator's
// device context current (cuda.Device.WithContext), as NCCL expects.
// ncclCommInitRank is collective and blocks until every rank has joined, so
// with one goroutine per GPU in a single process each rank's NewComm must
// run on its own goroutine, concurrently.
package nccl

/*
#cgo CFLAGS: -O2 -std=gnu11
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "nccl_shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/internal/dl"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// EnvNCCLPath overrides where libnccl is loaded from (a file, or a
// directory holding libnccl.so.2). When set, only that location is tried.
const EnvNCCLPath = "COLLGEN_NCCL_PATH"

// DataType is an ncclDataType_t.
type DataType int

// NCCL data types (nccl.h). FP8 types need NCCL 2.24 or newer.
const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6
	Float32  DataType = 7
	Float64  DataType = 8
	BFloat16 DataType = 9
	F8E4M3   DataType = 10 // ncclFloat8e4m3
	F8E5M2   DataType = 11 // ncclFloat8e5m2
)

// Size returns the element size in bytes (0 for an unknown type).
func (t DataType) Size() int {
	switch t {
	case Int8, Uint8, F8E4M3, F8E5M2:
		return 1
	case Float16, BFloat16:
		return 2
	case Int32, Uint32, Float32:
		return 4
	case Int64, Uint64, Float64:
		return 8
	}
	return 0
}

// String returns the collgen name of the type (f32, bf16, e4m3, ...).
func (t DataType) String() string {
	names := map[DataType]string{Int8: "i8", Uint8: "u8", Int32: "i32", Uint32: "u32", Int64: "i64", Uint64: "u64",
		Float16: "f16", Float32: "f32", Float64: "f64", BFloat16: "bf16", F8E4M3: "e4m3", F8E5M2: "e5m2"}
	if n, ok := names[t]; ok {
		return n
	}
	return fmt.Sprintf("DataType(%d)", int(t))
}

// RedOp is an ncclRedOp_t.
type RedOp int

// Reduction operations (nccl.h).
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4
)

// String returns the op name (sum, max, ...).
func (o RedOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Prod:
		return "prod"
	case Max:
		return "max"
	case Min:
		return "min"
	case Avg:
		return "avg"
	}
	return fmt.Sprintf("RedOp(%d)", int(o))
}

// Result is an ncclResult_t.
type Result int

// NCCL result codes (nccl.h).
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	TimedOut           Result = 8 // ncclTimeout (NCCL 2.28+)
)

// Error is a failed NCCL call.
type Error struct {
	Op     string // e.g. "ncclAllReduce(1024 f32 sum)"
	Rank   int    // communicator rank, -1 if none yet
	Code   Result // the ncclResult_t returned
	Msg    string // ncclGetErrorString
	Detail string // ncclGetLastError, when available
}

// Error formats the failed call, rank, NCCL message and last-error detail.
func (e *Error) Error() string {
	s := fmt.Sprintf("nccl: %s", e.Op)
	if e.Rank >= 0 {
		s += fmt.Sprintf(" on rank %d", e.Rank)
	}
	s += ": " + e.Msg
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s
}

const missingBase = C.CGN_MISSING_BASE

// MissingSymbol is the Code of an *Error whose library lacks the function
// called: an NCCL older than the one that added it (the message names that
// version). Such an error matches ErrMissingSymbol.
const MissingSymbol Result = -1

// ErrMissingSymbol is matched (errors.Is) by every *Error of Code
// MissingSymbol.
var ErrMissingSymbol = errors.New("nccl: libnccl lacks the function")

// Is makes errors.Is(err, ErrMissingSymbol) true for a missing function.
func (e *Error) Is(target error) bool { return target == ErrMissingSymbol && e.Code == MissingSymbol }

func newError(r C.ncclResult_t, op string, rank int, comm C.ncclComm_t) *Error {
	e := &Error{Op: op, Rank: rank, Code: Result(r)}
	if int(r) >= missingBase {
		e.Code = MissingSymbol
		e.Msg = missingMsg(C.GoString(C.cgn_symbol(C.int(int(r) - missingBase))))
		return e
	}
	e.Msg = C.GoString(C.cgn_ncclGetErrorString(r))
	e.Detail = strings.TrimSpace(C.GoString(C.cgn_ncclGetLastError(comm)))
	return e
}

// LibraryError reports a libnccl that could not be loaded or lacks a
// required symbol (the same type as runtime/cuda's).
type LibraryError = dl.LibraryError

// Lib is the loaded NCCL library (one per process).
type Lib struct {
	Path    string // what was dlopened
	version int    // ncclGetVersion code, e.g. 22803
}

// Version is an NCCL version.
type Version struct {
	Major, Minor, Patch int // 2, 28, 3 for NCCL 2.28.3 (ncclGetVersion code 22803)
}

// String formats the version as major.minor.patch.
func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Version returns the library's version (ncclGetVersion).
func (l *Lib) Version() Version {
	c := l.version
	if c >= 10000 { // NCCL >= 2.9: major*10000 + minor*100 + patch
		return Version{c / 10000, c / 100 % 100, c % 100}
	}
	return Version{c / 1000, c / 100 % 10, c % 100}
}

// AtLeast reports whether the library is at least major.minor.
func (l *Lib) AtLeast(major, minor int) bool {
	v := l.Version()
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// Registers reports whether the library can register buffers
// (ncclCommRegister, NCCL 2.19 and newer).
func (l *Lib) Registers() bool { return l.AtLeast(2, 19) }

// HasFP8 reports whether the library reduces and gathers fp8 (e4m3,
// e5m2: NCCL 2.24 and newer).
func (l *Lib) HasFP8() bool { return l.AtLeast(2, 24) }

// HasWindows reports whether the library has windows
// (ncclCommWindowRegister, NCCL 2.27 and newer).
func (l *Lib) HasWindows() bool { return l.AtLeast(2, 27) }

var (
	loadMu sync.Mutex
	loaded *Lib
)

// required symbols; the others fail only the call that needs them.
var required = []int{C.CGN_ncclGetVersion, C.CGN_ncclGetUniqueId, C.CGN_ncclCommInitRank, C.CGN_ncclCommDestroy,
	C.CGN_ncclGetErrorString, C.CGN_ncclAllReduce, C.CGN_ncclReduceScatter, C.CGN_ncclAllGather}

// spec is where libnccl is looked for.
func spec() dl.Spec {
	return dl.Spec{Lib: "libnccl", Env: EnvNCCLPath, Sonames: []string{"libnccl.so.2", "libnccl.so"},
		Hint: "install NCCL 2 (or set " + EnvNCCLPath + "); without it the generated kernels still run, and sizes the rules give to NCCL fail"}
}

// open dlopens libnccl as spec says and resolves symbols into a C table
// (the caller frees it) without installing anything; the caller closes the
// library when it does not install the table.
func open(spec dl.Spec) (unsafe.Pointer, *dl.Library, error) {
	l, err := dl.Open(spec)
	if err != nil {
		return nil, nil, err
	}
	tbl := C.malloc(C.size_t(C.CGN_COUNT) * C.size_t(unsafe.Sizeof(uintptr(0))))
	C.cgn_resolve(l.Handle(), (*unsafe.Pointer)(tbl))
	entries := unsafe.Slice((*unsafe.Pointer)(tbl), int(C.CGN_COUNT))
	for _, i := range required {
		if entries[i] == nil {
			C.free(tbl)
			l.Close()
			return nil, nil, l.Missing(C.GoString(C.cgn_symbol(C.int(i))), "not a usable NCCL library")
		}
	}
	return tbl, l, nil
}

// Load loads libnccl once per process (a failure is retried on the next
// call) and reports its version.
func Load() (*Lib, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != nil {
		return loaded, nil
	}
	tbl, lib, err := open(spec())
	if err != nil {
		return nil, err
	}
	path := lib.Path // never closed: the installed table points into it
	C.cgn_commit((*unsafe.Pointer)(tbl))
	C.free(tbl)
	var v C.int
	if r := C.cgn_ncclGetVersion(&v); r != 0 {
		return nil, newError(r, "ncclGetVersion", -1, nil)
	}
	loaded = &Lib{Path: path, version: int(v)}
	return loaded, nil
}

// UniqueIDSize is sizeof(ncclUniqueId).
const UniqueIDSize = 128

// UniqueID is an ncclUniqueId: made by one rank, shared with all.
type UniqueID [UniqueIDSize]byte

// NewUniqueID makes a communicator id (ncclGetUniqueId). It also starts
// NCCL's bootstrap listener in this process, so only the rank that owns
// the id should call it.
func (l *Lib) NewUniqueID() (UniqueID, error) {
	var id UniqueID
	if r := C.cgn_ncclGetUniqueId(unsafe.Pointer(&id[0])); r != 0 {
		return id, newError(r, "ncclGetUniqueId", -1, nil)
	}
	return id, nil
}

// GroupStart begins an NCCL group (for one goroutine driving several
// communicators); pair with GroupEnd.
func (l *Lib) GroupStart() error {
	if r := C.cgn_ncclGroupStart(); r != 0 {
		return newError(r, "ncclGroupStart", -1, nil)
	}
	return nil
}

// GroupEnd ends an NCCL group.
func (l *Lib) GroupEnd() error {
	if r := C.cgn_ncclGroupEnd(); r != 0 {
		return newError(r, "ncclGroupEnd", -1, nil)
	}
	return nil
}

// Comm is one rank's NCCL communicator, bound to one device.
//
// Locking: opMu serialises operations (an NCCL call and, on a
// non-blocking communicator, the wait until NCCL finished it), as NCCL
// requires of one communicator; ncclCommGetAsyncError is an operation too
// (it joins NCCL's finished background job, which two concurrent callers
// would free twice). Every NCCL call on the handle also holds mu for
// reading; Abort and Close take it for writing to clear the handle, so
// no call uses a freed communicator. They do not take opMu: waits hold mu
// only around each poll, so Abort from another goroutine gets the lock
// promptly; aborting is raised first so waits stop polling.
type Comm struct {
	lib         *Lib
	dev         *cuda.Device
	rank, world int
	opMu        sync.Mutex
	mu          sync.RWMutex
	c           C.ncclComm_t
	// winSlot is C memory NCCL writes a new window's handle into: on a
	// non-blocking communicator from its background thread, after
	// ncclCommWindowRegister has returned (Go memory must not be kept by
	// C). Read under opMu after the wait; freed by release once NCCL has
	// torn the communicator down (its threads joined).
	winSlot *C.ncclWindow_t
	// nonBlocking: created with blocking = 0 (NewCommConfig); timeout
	// bounds each wait for an operation NCCL has not finished.
	nonBlocking bool
	timeout     time.Duration
	aborting    atomic.Bool
}

// newComm makes the Comm value before its NCCL handle exists.
func newComm(lib *Lib, dev *cuda.Device, rank, world int, nonBlocking bool, timeout time.Duration) *Comm {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	slot := (*C.ncclWindow_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.ncclWindow_t(nil)))))
	return &Comm{lib: lib, dev: dev, rank: rank, world: world, winSlot: slot, nonBlocking: nonBlocking, timeout: timeout}
}

// freeSlot frees winSlot; only release (and a failed constructor) call it.
func (c *Comm) freeSlot() {
	C.free(unsafe.Pointer(c.winSlot))
	c.winSlot = nil
}

// NewComm creates rank's communicator of world ranks on dev. Rank 0 makes
// the unique id and publishes it in store under key+"/nccl-id"; the others
// wait for it (bounded by ctx). The key must be fresh for each
// communicator. Then ncclCommInitRank runs, which blocks until all ranks
// have joined (ctx does not bound that part): with goroutine-per-GPU, call
// NewComm for every rank concurrently, each on its own goroutine.
func NewComm(ctx context.Context, store rendezvous.Store, key string, rank, world int, dev *cuda.Device) (*Comm, error) {
	lib, id, err := agreeID(ctx, store, key, rank, world)
	if err != nil {
		return nil, err
	}
	cm := newComm(lib, dev, rank, world, false, 0)
	err = dev.WithContext(func() error {
		var h C.ncclComm_t // written before ncclCommInitRank returns
		if r := C.cgn_ncclCommInitRank(&h, C.int(world), unsafe.Pointer(&id[0]), C.int(rank)); r != 0 {
			return newError(r, fmt.Sprintf("ncclCommInitRank(world %d, device %d)", world, dev.Ordinal), rank, nil)
		}
		cm.c = h
		return nil
	})
	if err != nil {
		cm.freeSlot()
		return nil, err
	}
	return cm, nil
}

// Rank returns the communicator rank.
func (c *Comm) Rank() int { return c.rank }

// WorldSize returns the number of ranks.
func (c *Comm) WorldSize() int { return c.world }

// Device returns the communicator's device.
func (c *Comm) Device() *cuda.Device { return c.dev }

// call runs fn with the device context current and the comm handle, as
// one operation (under opMu).
func (c *Comm) call(op func() string, fn func(C.ncclComm_t) C.ncclResult_t) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	return c.callLocked(op, fn)
}

// callLocked is call with opMu held. On a non-blocking communicator it
// then waits until NCCL has finished the operation (wait), whatever the
// call returned: NCCL reports ncclInProgress through
// ncclCommGetAsyncError, and some calls return ncclSuccess while their
// work still runs in NCCL's background thread (ncclCommWindowRegister
// does, NCCL 2.28), after which the next call on the communicator fails
// ("Attempt to use communicator before the previous operation returned
// ncclSuccess"). So call returns when the operation is enqueued or failed.
func (c *Comm) callLocked(op func() string, fn func(C.ncclComm_t) C.ncclResult_t) error {
	err := c.withHandle(op, func(h C.ncclComm_t) error {
		if r := fn(h); r != 0 && !(c.nonBlocking && Result(r) == InProgress) {
			return newError(r, op(), c.rank, h)
		}
		return nil
	})
	if err != nil || !c.nonBlocking {
		return err
	}
	return c.wait(context.Background(), op, time.Now().Add(c.timeout))
}

// withHandle runs fn on the handle, under the read lock (so Abort and
// Close wait for it) and with the device context current.
func (c *Comm) withHandle(op func() string, fn func(C.ncclComm_t) error) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	h := c.c
	if h == nil {
		return c.goneError(op())
	}
	return c.dev.WithContext(func() error { return fn(h) })
}

// goneError is the error of a call on a closed or aborted communicator.
func (c *Comm) goneError(op string) error {
	if c.aborting.Load() {
		return fmt.Errorf("nccl: %s on rank %d: %w", op, c.rank, ErrAborted)
	}
	return fmt.Errorf("nccl: %s on rank %d: communicator closed", op, c.rank)
}

// stream returns the CUstream handle for s (0 for nil: the legacy default
// stream). A cudaStream_t is a CUstream.
func (c *Comm) stream(s *cuda.Stream) (C.ulonglong, error) {
	if s != nil && s.Device() != c.dev {
		return 0, fmt.Errorf("nccl: rank %d (device %d): stream belongs to device %d", c.rank, c.dev.Ordinal, s.Device().Ordinal)
	}
	return C.ulonglong(s.Handle()), nil
}

// AllReduce enqueues recv[i] = op over ranks of send[i], count elements,
// on s. send and recv may be the same buffer (in place).
func (c *Comm) AllReduce(send, recv cuda.DevicePtr, count int, dtype DataType, op RedOp, s *cuda.Stream) error {
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call(func() string { return fmt.Sprintf("ncclAllReduce(%d %v %v)", count, dtype, op) },
		func(h C.ncclComm_t) C.ncclResult_t {
			return C.cgn_ncclAllReduce(C.ulonglong(send), C.ulonglong(recv), C.size_t(count), C.int(dtype), C.int(op), h, st)
		})
}

// ReduceScatter enqueues: rank r's recv (recvCount elements) = op over
// ranks of send[r*recvCount : (r+1)*recvCount]. send holds world*recvCount.
func (c *Comm) ReduceScatter(send, recv cuda.DevicePtr, recvCount int, dtype DataType, op RedOp, s *cuda.Stream) error {
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call(func() string { return fmt.Sprintf("ncclReduceScatter(%d %v %v)", recvCount, dtype, op) },
		func(h C.ncclComm_t) C.ncclResult_t {
			return C.cgn_ncclReduceScatter(C.ulonglong(send), C.ulonglong(recv), C.size_t(recvCount), C.int(dtype), C.int(op), h, st)
		})
}

// AllGather enqueues: recv[r*sendCount : (r+1)*sendCount] = rank r's send
// (sendCount elements). recv holds world*sendCount.
func (c *Comm) AllGather(send, recv cuda.DevicePtr, sendCount int, dtype DataType, s *cuda.Stream) error {
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call(func() string { return fmt.Sprintf("ncclAllGather(%d %v)", sendCount, dtype) },
		func(h C.ncclComm_t) C.ncclResult_t {
			return C.cgn_ncclAllGather(C.ulonglong(send), C.ulonglong(recv), C.size_t(sendCount), C.int(dtype), h, st)
		})
}

// AsyncError returns the communicator's asynchronous error (a failure in
// a collective already enqueued, or a remote rank's failure), nil if none.
// After an error the communicator must be aborted.
func (c *Comm) AsyncError() error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	_, err := c.poll(func() string { return "async error" })
	return err
}

// poll asks NCCL for the communicator's state once
// (ncclCommGetAsyncError, under opMu): whether an operation is still in
// progress, or the error it or an earlier one ended with.
func (c *Comm) poll(op func() string) (inProgress bool, err error) {
	err = c.withHandle(op, func(h C.ncclComm_t) error {
		var res C.ncclResult_t
		if r := C.cgn_ncclCommGetAsyncError(h, &res); r != 0 {
			return newError(r, op()+": ncclCommGetAsyncError", c.rank, h)
		}
		inProgress = Result(res) == InProgress
		if res != 0 && !inProgress {
			return newError(res, op(), c.rank, h)
		}
		return nil
	})
	return inProgress, err
}

// Abort tears the communicator down without waiting for pending work or
// other ranks (use after an error): NCCL kernels still running stop. Safe
// from any goroutine, also while another waits in a call of this Comm (it
// returns an error wrapping ErrAborted). The Comm is unusable afterwards.
func (c *Comm) Abort() error {
	c.aborting.Store(true)
	return c.release("ncclCommAbort", func(h C.ncclComm_t) C.ncclResult_t { return C.cgn_ncclCommAbort(h) })
}

// Close frees the communicator (ncclCommDestroy) after its pending work
// completes. A communicator that is not ready (an operation NCCL has not
// finished within the timeout, or an asynchronous error) is aborted
// instead, and Close returns why: ncclCommDestroy on it would return early
// without ending the NCCL group it began (NCCL 2.28), leaving this OS
// thread inside a group so that later NCCL calls on the thread are only
// queued (a communicator initialised there would report success without
// initialising). The Comm is unusable afterwards. Safe to call twice, and
// after Abort: later calls return nil.
func (c *Comm) Close() error {
	op := func() string { return "ncclCommDestroy" }
	c.opMu.Lock()
	err := c.wait(context.Background(), op, time.Now().Add(c.timeout))
	c.opMu.Unlock()
	if err != nil {
		if c.gone() {
			return nil
		}
		return errors.Join(fmt.Errorf("nccl: rank %d: close a communicator that is not ready: aborted instead: %w", c.rank, err), c.Abort())
	}
	return c.release("ncclCommDestroy", func(h C.ncclComm_t) C.ncclResult_t { return C.cgn_ncclCommDestroy(h) })
}

// gone reports whether the handle was released (Abort or Close).
func (c *Comm) gone() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.c == nil
}

// release hands the handle to fn (ncclCommAbort or ncclCommDestroy) once:
// later calls find it gone. Both run their NCCL work to the end before
// returning (NCCL runs a destroying communicator's group blocking) and
// join its background job, so winSlot is NCCL's no longer afterwards.
func (c *Comm) release(op string, fn func(C.ncclComm_t) C.ncclResult_t) error {
	c.mu.Lock() // waits for calls in NCCL, never for a wait's sleep
	h := c.c
	c.c = nil
	c.mu.Unlock()
	if h == nil {
		return nil
	}
	defer c.freeSlot()
	return c.dev.WithContext(func() error {
		if r := fn(h); r != 0 && !(c.nonBlocking && Result(r) == InProgress) {
			return newError(r, op, c.rank, nil)
		}
		return nil
	})
}

// freeTable frees a symbol table returned by open.
func freeTable(tbl unsafe.Pointer) { C.free(tbl) }
