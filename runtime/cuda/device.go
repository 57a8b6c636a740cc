//go:build cgo

// Package cuda is collgen's hand-written binding to the CUDA driver API and
// NVRTC. Both libraries are loaded at run time with dlopen, so the package
// builds (and its tests skip) on machines with no CUDA toolkit and no GPU.
//
// Threading: a CUDA context is current per OS thread, while goroutines move
// between threads. Every method that calls the driver therefore locks the
// goroutine to its thread, makes its device's primary context current, makes
// the call(s) and unlocks; no method relies on what is current beforehand.
// Goroutine-per-GPU code in one process works without further care.
package cuda

/*
#include <stdlib.h>
#include "cuda_shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Device attribute numbers (CUdevice_attribute in cuda.h).
const (
	attrMultiprocessorCount  = 16
	attrCanMapHostMemory     = 19
	attrUnifiedAddressing    = 41
	attrComputeCapabilityMaj = 75
	attrComputeCapabilityMin = 76
)

// Device is one GPU with its primary context retained. Devices are shared:
// Open returns the same *Device for an ordinal until every Open is matched
// by a Close, and all methods are safe for concurrent use.
type Device struct {
	Ordinal  int    // CUDA ordinal in this process
	Name     string // e.g. "NVIDIA H200"
	Major    int    // compute capability major
	Minor    int    // compute capability minor
	SMCount  int    // streaming multiprocessors
	TotalMem uint64 // bytes of device memory
	PCIBusID string // "0000:18:00.0", stable across processes

	dev   C.CUdevice
	ctx   C.CUcontext
	refs  int  // guarded by devicesMu
	early bool // EarlyLaunch's answer, fixed at Open (launches ask it every call)
}

var (
	devicesMu sync.Mutex
	devices   = map[int]*Device{}
)

// DeviceCount returns how many CUDA devices the driver sees: 0 (and no
// error) when the driver loads but has none; an error when libcuda cannot
// be loaded.
func DeviceCount() (int, error) {
	if err := loadDriver(); err != nil {
		if IsCode(err, ErrorNoDevice) {
			return 0, nil
		}
		return 0, err
	}
	var n C.int
	if r := C.cg_cuDeviceGetCount(&n); r != 0 {
		if Result(r) == ErrorNoDevice {
			return 0, nil
		}
		return 0, newError(r, "cuDeviceGetCount", -1)
	}
	return int(n), nil
}

// Open returns device ordinal with its primary context retained. Each Open
// must be matched by one Close; the context is released at the last Close.
func Open(ordinal int) (*Device, error) {
	if err := loadDriver(); err != nil {
		return nil, err
	}
	devicesMu.Lock()
	defer devicesMu.Unlock()
	if d := devices[ordinal]; d != nil {
		d.refs++
		return d, nil
	}
	d := &Device{Ordinal: ordinal}
	if r := C.cg_cuDeviceGet(&d.dev, C.int(ordinal)); r != 0 {
		return nil, newError(r, fmt.Sprintf("cuDeviceGet(%d)", ordinal), ordinal)
	}
	var name [256]C.char
	if r := C.cg_cuDeviceGetName(&name[0], C.int(len(name)), d.dev); r != 0 {
		return nil, newError(r, "cuDeviceGetName", ordinal)
	}
	d.Name = C.GoString(&name[0])
	attr := func(a int) (int, error) {
		var v C.int
		if r := C.cg_cuDeviceGetAttribute(&v, C.int(a), d.dev); r != 0 {
			return 0, newError(r, fmt.Sprintf("cuDeviceGetAttribute(%d)", a), ordinal)
		}
		return int(v), nil
	}
	var err error
	if d.Major, err = attr(attrComputeCapabilityMaj); err != nil {
		return nil, err
	}
	if d.Minor, err = attr(attrComputeCapabilityMin); err != nil {
		return nil, err
	}
	if d.SMCount, err = attr(attrMultiprocessorCount); err != nil {
		return nil, err
	}
	d.early = d.Arch() >= 90 && C.cg_has_launch_ex() != 0
	var total C.size_t
	if r := C.cg_cuDeviceTotalMem(&total, d.dev); r == 0 {
		d.TotalMem = uint64(total)
	}
	var bus [32]C.char
	if r := C.cg_cuDeviceGetPCIBusId(&bus[0], C.int(len(bus)), d.dev); r == 0 {
		d.PCIBusID = C.GoString(&bus[0])
	}
	if r := C.cg_cuDevicePrimaryCtxRetain(&d.ctx, d.dev); r != 0 {
		return nil, mpsHint(newError(r, "cuDevicePrimaryCtxRetain", ordinal))
	}
	d.refs = 1
	devices[ordinal] = d
	return d, nil
}

// OrdinalByPCIBusID returns this process's ordinal for the GPU at a PCI bus
// id (as reported by Device.PCIBusID in any process).
func OrdinalByPCIBusID(bus string) (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	cs := C.CString(bus)
	defer C.free(unsafe.Pointer(cs))
	var d C.CUdevice
	if r := C.cg_cuDeviceGetByPCIBusId(&d, cs); r != 0 {
		return 0, newError(r, fmt.Sprintf("cuDeviceGetByPCIBusId(%s)", bus), -1)
	}
	// CUdevice values are ordinals in practice; confirm by lookup.
	var n C.int
	if r := C.cg_cuDeviceGetCount(&n); r != 0 {
		return 0, newError(r, "cuDeviceGetCount", -1)
	}
	for i := 0; i < int(n); i++ {
		var di C.CUdevice
		if C.cg_cuDeviceGet(&di, C.int(i)) == 0 && di == d {
			return i, nil
		}
	}
	return int(d), nil
}

// Close drops one reference from Open; the last one releases the primary
// context. Memory, streams and modules of the device must be freed first.
func (d *Device) Close() error {
	devicesMu.Lock()
	defer devicesMu.Unlock()
	if d.refs <= 0 {
		return nil
	}
	d.refs--
	if d.refs > 0 {
		return nil
	}
	delete(devices, d.Ordinal)
	if r := C.cg_cuDevicePrimaryCtxRelease(d.dev); r != 0 {
		return newError(r, "cuDevicePrimaryCtxRelease", d.Ordinal)
	}
	return nil
}

// Arch returns the compute capability as an integer (9.0 -> 90).
func (d *Device) Arch() int { return d.Major*10 + d.Minor }

// String describes the device for logs.
func (d *Device) String() string {
	return fmt.Sprintf("device %d (%s, sm_%d, %d SMs)", d.Ordinal, d.Name, d.Arch(), d.SMCount)
}

// enter locks the goroutine to its OS thread and makes d's context current.
// On success the caller must runtime.UnlockOSThread (usually deferred).
func (d *Device) enter() error {
	runtime.LockOSThread()
	if r := C.cg_cuCtxSetCurrent(d.ctx); r != 0 {
		runtime.UnlockOSThread()
		return newError(r, "cuCtxSetCurrent", d.Ordinal)
	}
	return nil
}

// err wraps result r of op on this device.
func (d *Device) err(r C.CUresult, op string) error { return newError(r, op, d.Ordinal) }

// WithContext runs fn on a locked OS thread with d's primary context
// current, for code that calls CUDA-using C libraries (NCCL) itself. fn must
// not start goroutines that expect the context to be current.
func (d *Device) WithContext(fn func() error) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	return fn()
}

// Synchronize waits for all work on the device's context.
func (d *Device) Synchronize() error {
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuCtxSynchronize(); r != 0 {
		return d.err(r, "cuCtxSynchronize")
	}
	return nil
}

// MemInfo returns free and total device memory in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	defer runtime.UnlockOSThread()
	var f, t C.size_t
	if r := C.cg_cuMemGetInfo(&f, &t); r != 0 {
		return 0, 0, d.err(r, "cuMemGetInfo")
	}
	return uint64(f), uint64(t), nil
}

// CanAccessPeer reports whether kernels on d can access memory of peer.
func (d *Device) CanAccessPeer(peer *Device) (bool, error) {
	if d.Ordinal == peer.Ordinal {
		return true, nil
	}
	var can C.int
	if r := C.cg_cuDeviceCanAccessPeer(&can, d.dev, peer.dev); r != 0 {
		return false, d.err(r, fmt.Sprintf("cuDeviceCanAccessPeer(peer %d)", peer.Ordinal))
	}
	return can != 0, nil
}

// EnablePeerAccess lets d's context access peer's memory (one direction;
// call it on both devices for two-way access). Idempotent: peer access that
// is already enabled is not an error. A same-device "peer" is a no-op.
func (d *Device) EnablePeerAccess(peer *Device) error {
	if d.Ordinal == peer.Ordinal {
		return nil
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	r := C.cg_cuCtxEnablePeerAccess(peer.ctx, 0)
	if r != 0 && Result(r) != ErrorPeerAccessEnabled {
		return d.err(r, fmt.Sprintf("cuCtxEnablePeerAccess(peer device %d)", peer.Ordinal))
	}
	return nil
}
