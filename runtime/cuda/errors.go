//go:build cgo

package cuda

/*
#include "cuda_shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Result is a CUresult code.
type Result int

// CUresult codes that callers test for (values from cuda.h).
const (
	Success                  Result = 0
	ErrorInvalidValue        Result = 1
	ErrorOutOfMemory         Result = 2
	ErrorNotInitialized      Result = 3
	ErrorNoDevice            Result = 100
	ErrorInvalidDevice       Result = 101
	ErrorInvalidImage        Result = 200
	ErrorInvalidContext      Result = 201
	ErrorNoBinaryForGPU      Result = 209
	ErrorPeerAccessUnsupp    Result = 217
	ErrorInvalidPTX          Result = 218
	ErrorUnsupportedPTX      Result = 222
	ErrorNotFound            Result = 500
	ErrorNotReady            Result = 600
	ErrorPeerAccessEnabled   Result = 704 // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
	ErrorStreamCaptureUnsupp Result = 900
)

// missingSymbol is the Result a wrapper returns when its symbol was absent.
const missingSymbol Result = C.CG_MISSING_BASE

// Error is a failed driver call: the call with its key arguments, the
// device ordinal (-1 when none applies) and the CUresult with its name.
// Example: "cuda: cuMemAlloc(1073741824 bytes) on device 0: CUDA_ERROR_OUT_OF_MEMORY".
type Error struct {
	Op     string // the call, e.g. "cuMemAlloc(1073741824 bytes)"
	Device int    // device ordinal, -1 if not device specific
	Code   Result // the CUresult; -1 for a symbol missing from libcuda
	Name   string // e.g. "CUDA_ERROR_OUT_OF_MEMORY", or "symbol cuX not found in libcuda"
}

// Error formats the failed call, device and CUresult name.
func (e *Error) Error() string {
	if e.Device >= 0 {
		return fmt.Sprintf("cuda: %s on device %d: %s", e.Op, e.Device, e.Name)
	}
	return fmt.Sprintf("cuda: %s: %s", e.Op, e.Name)
}

// Is lets errors.Is(err, cuda.ErrorOutOfMemory) style checks work through
// Code: any *Error with the same Code matches, as does the bare Result.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case *Error:
		return t.Code == e.Code
	case Result:
		return t == e.Code
	}
	return false
}

// Error makes a Result usable as an errors.Is target.
func (r Result) Error() string { return resultName(r) }

// IsCode reports whether err is (or wraps) a driver *Error with code r.
func IsCode(err error, r Result) bool {
	var ce *Error
	return errors.As(err, &ce) && ce.Code == r
}

// resultName returns the CUresult's name from cuGetErrorName, or a
// numeric fallback.
func resultName(r Result) string {
	if r >= missingSymbol {
		return fmt.Sprintf("symbol %s not found in libcuda", C.GoString(C.cg_cu_symbol(C.int(r-missingSymbol))))
	}
	var s *C.char
	if C.cg_cuGetErrorName(C.CUresult(r), &s) == 0 && s != nil {
		return C.GoString(s)
	}
	return fmt.Sprintf("CUresult(%d)", int(r))
}

// newError builds an *Error for result r of call op on device dev.
func newError(r C.CUresult, op string, dev int) *Error {
	code := Result(r)
	name := resultName(code)
	if code >= missingSymbol {
		code = -1
	}
	return &Error{Op: op, Device: dev, Code: code, Name: name}
}

// nvrtcErrString names an nvrtcResult.
func nvrtcErrString(r C.nvrtcResult) string {
	if int(r) >= int(C.CG_MISSING_BASE) {
		return fmt.Sprintf("symbol %s not found in libnvrtc", C.GoString(C.cg_nvrtc_symbol(C.int(int(r)-int(C.CG_MISSING_BASE)))))
	}
	return C.GoString(C.cg_nvrtcGetErrorString(r))
}

// mpsHint explains a context that could not be created under MPS for want
// of the server's resources (CUDA_ERROR_OUT_OF_MEMORY, or an MPS error
// such as CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED): the work queues of the
// clients' contexts share one pool. Other errors come back as they are.
func mpsHint(e *Error) error {
	pipe := mpsPipe()
	v, set := os.LookupEnv(EnvMaxConnections)
	if pipe == "" || e.Code != ErrorOutOfMemory && !strings.Contains(e.Name, "MPS") {
		return e
	}
	return fmt.Errorf("%w (this process is a client of the MPS daemon at %s, and MPS clients' contexts share one pool of hardware work queues: with %s=%d each, fewer processes fit on a GPU, three at 32 on an H100; leave it unset under MPS, as collgen does, or run fewer processes on this GPU)",
		e, pipe, EnvMaxConnections, workQueuesFrom(v, set))
}
