//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "cuda_shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/collgen/collgen/runtime/internal/dl"
)

// This file binds the driver's virtual memory management (VMM): address
// reservations, physical allocations shareable as POSIX file descriptors,
// and mappings with per-device access. runtime/symm's CUDA backend builds
// symmetric memory from it. The entry points are resolved from libcuda on
// first use into a table of their own, so a driver that lacks them still
// loads; a call that needs a missing one fails with an *Error naming it.
//
// Ownership: a MemHandle from MemCreate or MemImportFD is one reference to
// a physical allocation; MemRelease drops it. The driver frees the memory
// once every reference is released and every mapping of it is unmapped,
// in whichever process those live, so an exporter may release its handle
// while importers still map the memory.

// Device attributes of VMM support (CUdevice_attribute).
const (
	attrVirtualMemoryManagementSupported = 102
	attrHandleTypePosixFDSupported       = 103
)

// MemHandle is a CUmemGenericAllocationHandle: one reference to a physical
// allocation made by MemCreate or imported by MemImportFD.
type MemHandle uint64

var (
	vmmMu     sync.Mutex
	vmmLoaded bool
)

// loadVMM resolves the VMM entry points from libcuda once per process.
// Missing ones stay nil; their wrappers then report which symbol is absent.
func loadVMM() error {
	if err := loadDriver(); err != nil {
		return err
	}
	vmmMu.Lock()
	defer vmmMu.Unlock()
	if vmmLoaded {
		return nil
	}
	// dl.Open returns the handle loadDriver opened (same path, refcounted);
	// like the driver's own, it is never closed.
	l, err := dl.Open(driverSpec())
	if err != nil {
		return err
	}
	tbl := C.malloc(C.size_t(C.CG_VMM_COUNT) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(tbl)
	C.cg_vmm_resolve(l.Handle(), (*unsafe.Pointer)(tbl))
	C.cg_vmm_commit((*unsafe.Pointer)(tbl))
	vmmLoaded = true
	return nil
}

// vmmErr builds the error for result r of a VMM call: an *Error with the
// CUresult, or, for a symbol the driver lacks, Code -1 and a Name saying
// which symbol libcuda does not export.
func vmmErr(r C.CUresult, op string, dev int) error {
	if int(r) >= int(C.CG_VMM_MISSING_BASE) {
		sym := C.GoString(C.cg_vmm_symbol(C.int(int(r) - int(C.CG_VMM_MISSING_BASE))))
		return &Error{Op: op, Device: dev, Code: -1,
			Name: fmt.Sprintf("symbol %s not found in libcuda (driver %s too old for virtual memory management)", sym, DriverPath())}
	}
	return newError(r, op, dev)
}

// vmmEnter loads the VMM table and enters d's context (see enter).
func (d *Device) vmmEnter() error {
	if err := loadVMM(); err != nil {
		return err
	}
	return d.enter()
}

// VMMSupported reports whether d supports virtual memory management with
// allocations shareable as POSIX file descriptors, which runtime/symm's
// CUDA backend needs. An error is returned only when the driver cannot be
// asked.
func (d *Device) VMMSupported() (bool, error) {
	for _, a := range []int{attrVirtualMemoryManagementSupported, attrHandleTypePosixFDSupported} {
		var v C.int
		if r := C.cg_cuDeviceGetAttribute(&v, C.int(a), d.dev); r != 0 {
			return false, d.err(r, fmt.Sprintf("cuDeviceGetAttribute(%d)", a))
		}
		if v == 0 {
			return false, nil
		}
	}
	return true, nil
}

// MemGranularity is the allocation granularity for collgen's VMM
// allocations on d (pinned, POSIX-fd shareable): the recommended one
// (for performance), or the minimum. Sizes passed to MemAddressReserve,
// MemCreate, MemMap and MemSetAccess must be multiples of it.
func (d *Device) MemGranularity(recommended bool) (int, error) {
	if err := d.vmmEnter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	rec := C.int(0)
	if recommended {
		rec = 1
	}
	var g C.size_t
	if r := C.cg_vmm_granularity(&g, C.int(d.Ordinal), rec); r != 0 {
		return 0, vmmErr(r, "cuMemGetAllocationGranularity", d.Ordinal)
	}
	return int(g), nil
}

// MemAddressReserve reserves size bytes of the process's unified virtual
// address space, aligned to align (0: the granularity), with nothing
// mapped. Release it with MemAddressFree once nothing is mapped in it.
func (d *Device) MemAddressReserve(size, align int) (DevicePtr, error) {
	if err := checkSize("cuMemAddressReserve", d.Ordinal, size); err != nil {
		return 0, err
	}
	if err := checkSize("cuMemAddressReserve (alignment)", d.Ordinal, align); err != nil {
		return 0, err
	}
	if err := d.vmmEnter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	var p C.CUdeviceptr
	if r := C.cg_vmm_reserve(&p, C.size_t(size), C.size_t(align)); r != 0 {
		return 0, vmmErr(r, fmt.Sprintf("cuMemAddressReserve(%d bytes)", size), d.Ordinal)
	}
	return DevicePtr(p), nil
}

// MemAddressFree releases a reservation from MemAddressReserve (whole).
func (d *Device) MemAddressFree(p DevicePtr, size int) error {
	if err := checkSize("cuMemAddressFree", d.Ordinal, size); err != nil {
		return err
	}
	if err := d.vmmEnter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_vmm_free(C.CUdeviceptr(p), C.size_t(size)); r != 0 {
		return vmmErr(r, fmt.Sprintf("cuMemAddressFree(%#x, %d bytes)", uintptr(p), size), d.Ordinal)
	}
	return nil
}

// MemCreate allocates size bytes of physical memory on d (pinned, not
// zeroed, shareable as a POSIX file descriptor) and returns a handle to
// it. Nothing can reach it until it is mapped (MemMap) and access is set
// (MemSetAccess). Release the handle with MemRelease.
func (d *Device) MemCreate(size int) (MemHandle, error) {
	if err := checkSize("cuMemCreate", d.Ordinal, size); err != nil {
		return 0, err
	}
	if err := d.vmmEnter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	var h C.CUmemGenericAllocationHandle
	if r := C.cg_vmm_create(&h, C.size_t(size), C.int(d.Ordinal)); r != 0 {
		return 0, vmmErr(r, fmt.Sprintf("cuMemCreate(%d bytes, POSIX fd shareable)", size), d.Ordinal)
	}
	return MemHandle(h), nil
}

// MemRelease drops the reference h. Mappings of the memory stay valid;
// the memory is freed once it is neither referenced nor mapped anywhere.
func (d *Device) MemRelease(h MemHandle) error {
	if err := d.vmmEnter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_vmm_release(C.CUmemGenericAllocationHandle(h)); r != 0 {
		return vmmErr(r, "cuMemRelease", d.Ordinal)
	}
	return nil
}

// MemMap maps the first size bytes of h's memory at p, inside a
// reservation. It fails when the allocation is smaller than size. The
// range is not accessible until MemSetAccess.
func (d *Device) MemMap(p DevicePtr, size int, h MemHandle) error {
	if err := checkSize("cuMemMap", d.Ordinal, size); err != nil {
		return err
	}
	if err := d.vmmEnter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_vmm_map(C.CUdeviceptr(p), C.size_t(size), C.CUmemGenericAllocationHandle(h)); r != 0 {
		return vmmErr(r, fmt.Sprintf("cuMemMap(%#x, %d bytes)", uintptr(p), size), d.Ordinal)
	}
	return nil
}

// MemUnmap unmaps [p, p+size), which must be a whole mapping; the range
// stays reserved. Work still running against the range must have
// finished: the driver does not wait for it.
func (d *Device) MemUnmap(p DevicePtr, size int) error {
	if err := checkSize("cuMemUnmap", d.Ordinal, size); err != nil {
		return err
	}
	if err := d.vmmEnter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_vmm_unmap(C.CUdeviceptr(p), C.size_t(size)); r != 0 {
		return vmmErr(r, fmt.Sprintf("cuMemUnmap(%#x, %d bytes)", uintptr(p), size), d.Ordinal)
	}
	return nil
}

// MemSetAccess makes the mapped range [p, p+size) readable and writable
// by every device in devs (at least one, at most 64).
func (d *Device) MemSetAccess(p DevicePtr, size int, devs ...*Device) error {
	if len(devs) == 0 || len(devs) > 64 {
		return fmt.Errorf("cuda: cuMemSetAccess on device %d: %d devices, want 1 to 64: %w", d.Ordinal, len(devs), ErrInvalidArgument)
	}
	if err := checkSize("cuMemSetAccess", d.Ordinal, size); err != nil {
		return err
	}
	ords := make([]C.int, len(devs))
	for i, x := range devs {
		if x == nil {
			return fmt.Errorf("cuda: cuMemSetAccess on device %d: device %d of %d is nil: %w", d.Ordinal, i, len(devs), ErrInvalidArgument)
		}
		ords[i] = C.int(x.Ordinal)
	}
	if err := d.vmmEnter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_vmm_set_access(C.CUdeviceptr(p), C.size_t(size), &ords[0], C.int(len(ords))); r != 0 {
		return vmmErr(r, fmt.Sprintf("cuMemSetAccess(%#x, %d bytes, read-write for devices %v)", uintptr(p), size, ords), d.Ordinal)
	}
	return nil
}

// MemExportFD exports h as a new POSIX file descriptor (close-on-exec)
// that another process can pass to MemImportFD, e.g. over a Unix socket
// with SCM_RIGHTS. The caller closes the file; the memory does not need it.
func (d *Device) MemExportFD(h MemHandle) (*os.File, error) {
	if err := d.vmmEnter(); err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	var fd C.int = -1
	// The driver makes the descriptor without O_CLOEXEC: hold ForkLock
	// (as the syscall package does for such descriptors) until it is
	// marked, so a fork and exec in another goroutine (os/exec) cannot
	// pass the memory's descriptor on to the child.
	syscall.ForkLock.RLock()
	r := C.cg_vmm_export_fd(&fd, C.CUmemGenericAllocationHandle(h))
	if r == 0 {
		syscall.CloseOnExec(int(fd))
	}
	syscall.ForkLock.RUnlock()
	if r != 0 {
		return nil, vmmErr(r, "cuMemExportToShareableHandle(POSIX fd)", d.Ordinal)
	}
	return os.NewFile(uintptr(fd), "cuda-vmm-export"), nil
}

// MemImportFD imports an allocation exported by MemExportFD (in any
// process of this host) and returns a new reference to it, which the
// caller releases with MemRelease. f stays the caller's to close.
func (d *Device) MemImportFD(f *os.File) (MemHandle, error) {
	if err := d.vmmEnter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	var h C.CUmemGenericAllocationHandle
	r := C.cg_vmm_import_fd(&h, C.int(f.Fd()))
	runtime.KeepAlive(f)
	if r != 0 {
		return 0, vmmErr(r, "cuMemImportFromShareableHandle(POSIX fd)", d.Ordinal)
	}
	return MemHandle(h), nil
}

// MemDevice returns the ordinal, in this process, of the device whose
// memory h refers to, or an error if h is not device memory.
func (d *Device) MemDevice(h MemHandle) (int, error) {
	if err := d.vmmEnter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	var typ, id C.int
	if r := C.cg_vmm_location(C.CUmemGenericAllocationHandle(h), &typ, &id); r != 0 {
		return 0, vmmErr(r, "cuMemGetAllocationPropertiesFromHandle", d.Ordinal)
	}
	if typ != 1 {
		return 0, fmt.Errorf("cuda: imported allocation on device %d has location type %d, want device memory (1)", d.Ordinal, int(typ))
	}
	return int(id), nil
}
