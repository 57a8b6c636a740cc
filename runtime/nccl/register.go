package nccl

/*
#include "nccl_shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/collgen/collgen/runtime/cuda"
)

// RegHandle is a buffer registration (ncclCommRegister's handle).
type RegHandle uintptr

// Register registers [p, p+bytes) with the communicator
// (ncclCommRegister, NCCL 2.19+), so collectives on it can run without
// NCCL's internal copies. It is local (no other rank takes part). The
// memory must stay allocated until Deregister.
func (c *Comm) Register(p cuda.DevicePtr, bytes int) (RegHandle, error) {
	if p == 0 || bytes <= 0 {
		return 0, fmt.Errorf("nccl: register %#x (%d bytes) on rank %d: need a device address and a positive size", uintptr(p), bytes, c.rank)
	}
	var h C.ulonglong
	err := c.call(func() string { return fmt.Sprintf("ncclCommRegister(%#x, %d bytes)", uintptr(p), bytes) },
		func(cm C.ncclComm_t) C.ncclResult_t {
			return C.cgn_ncclCommRegister(cm, C.ulonglong(p), C.size_t(bytes), &h)
		})
	return RegHandle(h), err
}

// Deregister drops a registration from Register (ncclCommDeregister).
func (c *Comm) Deregister(h RegHandle) error {
	return c.call(func() string { return fmt.Sprintf("ncclCommDeregister(%#x)", uintptr(h)) },
		func(cm C.ncclComm_t) C.ncclResult_t {
			return C.cgn_ncclCommDeregister(cm, C.ulonglong(h))
		})
}

// Window is an NCCL window (ncclWindow_t).
type Window uintptr

// WindowFlags are ncclCommWindowRegister's flags.
type WindowFlags int

// WindowSymmetric (NCCL_WIN_COLL_SYMMETRIC) lets NCCL run its symmetric
// kernels on collectives whose buffers lie in the window; every rank's
// window must have the same size.
const WindowSymmetric WindowFlags = C.CGN_NCCL_WIN_COLL_SYMMETRIC

// WindowAlign is the alignment NCCL needs of a window's address and size
// (NCCL_WIN_REQUIRED_ALIGNMENT).
const WindowAlign = 4096

// WindowRegister registers [p, p+bytes) as a window
// (ncclCommWindowRegister, NCCL 2.27+). It is collective: every rank
// registers its buffer in the same order. The memory must come from the
// VMM API (cuMemCreate/cuMemMap, e.g. runtime/symm's CUDA backend, or
// MemAlloc); NCCL refuses cuMemAlloc memory. A zero Window with a nil
// error means NCCL chose not to register (NCCL_LOCAL_REGISTER=0 without
// symmetric support); deregistering it is a no-op.
func (c *Comm) WindowRegister(p cuda.DevicePtr, bytes int, flags WindowFlags) (Window, error) {
	if p == 0 || bytes <= 0 {
		return 0, fmt.Errorf("nccl: window %#x (%d bytes) on rank %d: need a device address and a positive size", uintptr(p), bytes, c.rank)
	}
	op := func() string {
		return fmt.Sprintf("ncclCommWindowRegister(%#x, %d bytes, flags %#x)", uintptr(p), bytes, int(flags))
	}
	c.opMu.Lock()
	defer c.opMu.Unlock()
	var w Window
	err := c.callLocked(op, func(cm C.ncclComm_t) C.ncclResult_t {
		*c.winSlot = nil
		return C.cgn_ncclCommWindowRegister(cm, C.ulonglong(p), C.size_t(bytes), c.winSlot, C.int(flags))
	})
	if err != nil {
		return 0, err
	}
	// Read under the read lock: release frees winSlot after clearing the
	// handle.
	err = c.withHandle(op, func(C.ncclComm_t) error {
		w = Window(unsafe.Pointer(*c.winSlot))
		return nil
	})
	return w, err
}

// WindowDeregister drops a window (ncclCommWindowDeregister); collective
// like WindowRegister.
func (c *Comm) WindowDeregister(w Window) error {
	return c.call(func() string { return fmt.Sprintf("ncclCommWindowDeregister(%#x)", uintptr(w)) },
		func(cm C.ncclComm_t) C.ncclResult_t {
			return C.cgn_ncclCommWindowDeregister(cm, C.ulonglong(w))
		})
}

// MemAlloc allocates bytes on dev with ncclMemAlloc (NCCL 2.19+): VMM
// memory NCCL can register as a window or register for NVLS. Free it with
// MemFree.
func (l *Lib) MemAlloc(dev *cuda.Device, bytes int) (cuda.DevicePtr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("nccl: ncclMemAlloc of %d bytes: size must be positive", bytes)
	}
	var p C.ulonglong
	err := dev.WithContext(func() error {
		if r := C.cgn_ncclMemAlloc(&p, C.size_t(bytes)); r != 0 {
			return newError(r, fmt.Sprintf("ncclMemAlloc(%d bytes, device %d)", bytes, dev.Ordinal), -1, nil)
		}
		return nil
	})
	return cuda.DevicePtr(p), err
}

// MemFree frees memory from MemAlloc (ncclMemFree). Freeing 0 is a no-op.
func (l *Lib) MemFree(dev *cuda.Device, p cuda.DevicePtr) error {
	if p == 0 {
		return nil
	}
	return dev.WithContext(func() error {
		if r := C.cgn_ncclMemFree(C.ulonglong(p)); r != 0 {
			return newError(r, fmt.Sprintf("ncclMemFree(%#x)", uintptr(p)), -1, nil)
		}
		return nil
	})
}
