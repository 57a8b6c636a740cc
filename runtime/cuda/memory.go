//go:build cgo

package cuda

/*
#include "cuda_shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Alloc allocates bytes of device memory. The caller frees it with Free.
func (d *Device) Alloc(bytes int) (DevicePtr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cuda: alloc of %d bytes on device %d: size must be positive: %w", bytes, d.Ordinal, ErrInvalidArgument)
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	var p C.CUdeviceptr
	if r := C.cg_cuMemAlloc(&p, C.size_t(bytes)); r != 0 {
		return 0, d.err(r, fmt.Sprintf("cuMemAlloc(%d bytes)", bytes))
	}
	return DevicePtr(p), nil
}

// Free releases memory from Alloc. Freeing 0 is a no-op. cuMemFree
// synchronizes the device, so do not call it in a hot path.
func (d *Device) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuMemFree(C.CUdeviceptr(p)); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemFree(%#x)", uintptr(p)))
	}
	return nil
}

// AddressRange returns the base and size of the allocation containing p.
func (d *Device) AddressRange(p DevicePtr) (base DevicePtr, size int, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	defer runtime.UnlockOSThread()
	var b C.CUdeviceptr
	var n C.size_t
	if r := C.cg_cuMemGetAddressRange(&b, &n, C.CUdeviceptr(p)); r != 0 {
		return 0, 0, d.err(r, fmt.Sprintf("cuMemGetAddressRange(%#x)", uintptr(p)))
	}
	return DevicePtr(b), int(n), nil
}

// MemoryType is where an address points (CUmemorytype).
type MemoryType int

// Memory types (cuda.h CUmemorytype).
const (
	MemoryUnknown MemoryType = 0 // not an address the driver knows
	MemoryHost    MemoryType = 1 // page-locked host memory
	MemoryDevice  MemoryType = 2 // device memory (cuMemAlloc or VMM)
	MemoryArray   MemoryType = 3
	MemoryUnified MemoryType = 4
)

// PointerInfo is what the driver knows about an address.
type PointerInfo struct {
	Type    MemoryType // MemoryUnknown for an address the driver does not know
	Managed bool       // unified (cuMemAllocManaged) memory
	Ordinal int        // the device the memory is on (device memory only)
}

// pointer attributes (cuda.h CUpointer_attribute).
const (
	pointerAttrMemoryType    = 2
	pointerAttrIsManaged     = 8
	pointerAttrDeviceOrdinal = 9
)

// Pointer describes p (cuPointerGetAttribute). An address the driver does
// not know (plain host memory, garbage) has Type MemoryUnknown and no
// error.
func (d *Device) Pointer(p DevicePtr) (PointerInfo, error) {
	if err := d.enter(); err != nil {
		return PointerInfo{}, err
	}
	defer runtime.UnlockOSThread()
	var typ C.uint
	switch r := C.cg_cuPointerGetAttribute(unsafe.Pointer(&typ), pointerAttrMemoryType, C.CUdeviceptr(p)); {
	case r == C.CUresult(ErrorInvalidValue):
		return PointerInfo{}, nil
	case r != 0:
		return PointerInfo{}, d.err(r, fmt.Sprintf("cuPointerGetAttribute(%#x, memory type)", uintptr(p)))
	}
	info := PointerInfo{Type: MemoryType(typ), Ordinal: -1}
	var managed C.uint
	if r := C.cg_cuPointerGetAttribute(unsafe.Pointer(&managed), pointerAttrIsManaged, C.CUdeviceptr(p)); r != 0 {
		return info, d.err(r, fmt.Sprintf("cuPointerGetAttribute(%#x, is managed)", uintptr(p)))
	}
	info.Managed = managed != 0
	if info.Type == MemoryDevice {
		var ord C.int
		if r := C.cg_cuPointerGetAttribute(unsafe.Pointer(&ord), pointerAttrDeviceOrdinal, C.CUdeviceptr(p)); r != 0 {
			return info, d.err(r, fmt.Sprintf("cuPointerGetAttribute(%#x, device ordinal)", uintptr(p)))
		}
		info.Ordinal = int(ord)
	}
	return info, nil
}

// Memset8 sets n bytes at dst to v and waits for it (cuMemsetD8 alone
// returns before a memset of device memory has run: see waitLegacy).
func (d *Device) Memset8(dst DevicePtr, v byte, n int) error {
	if err := checkSize("cuMemsetD8", d.Ordinal, n); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuMemsetD8(C.CUdeviceptr(dst), C.uchar(v), C.size_t(n)); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemsetD8(%d bytes)", n))
	}
	return d.waitLegacy("cuMemsetD8")
}

// MemsetD32 sets n 32-bit words at dst (4-byte aligned) to v and waits.
func (d *Device) MemsetD32(dst DevicePtr, v uint32, n int) error {
	if err := checkSize("cuMemsetD32", d.Ordinal, n); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuMemsetD32(C.CUdeviceptr(dst), C.uint(v), C.size_t(n)); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemsetD32(%d words)", n))
	}
	return d.waitLegacy("cuMemsetD32")
}

// waitLegacy waits for the legacy default stream, where the driver's
// "synchronous" memsets and copies run: cuMemsetD8/D32 and
// cuMemcpyDtoD return before the work has run, and cuMemcpyHtoD from
// pageable memory once the source is staged, perhaps before it has reached
// the device. Without the wait, work on a non-blocking stream (every
// communicator's own stream) issued after such a call may run before it
// and read or overwrite the memory. The caller holds the context (enter).
func (d *Device) waitLegacy(after string) error {
	if r := C.cg_cuStreamSynchronize(nil); r != 0 {
		return d.err(r, "cuStreamSynchronize(legacy stream) after "+after)
	}
	return nil
}

// Memset8Async enqueues a byte memset on s (nil: the legacy default stream).
func (d *Device) Memset8Async(dst DevicePtr, v byte, n int, s *Stream) error {
	if err := s.usable("cuMemsetD8Async"); err != nil {
		return err
	}
	if err := checkSize("cuMemsetD8Async", d.Ordinal, n); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := s.issue(func() C.CUresult {
		return C.cg_cuMemsetD8Async(C.CUdeviceptr(dst), C.uchar(v), C.size_t(n), s.handle())
	}); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemsetD8Async(%d bytes)", n))
	}
	return nil
}

// MemsetD32Async enqueues a 32-bit memset of n words on s.
func (d *Device) MemsetD32Async(dst DevicePtr, v uint32, n int, s *Stream) error {
	if err := s.usable("cuMemsetD32Async"); err != nil {
		return err
	}
	if err := checkSize("cuMemsetD32Async", d.Ordinal, n); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := s.issue(func() C.CUresult {
		return C.cg_cuMemsetD32Async(C.CUdeviceptr(dst), C.uint(v), C.size_t(n), s.handle())
	}); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemsetD32Async(%d words)", n))
	}
	return nil
}

// CopyHtoD copies src to device memory dst and waits until it is there
// (see waitLegacy). src may be any Go memory: the driver is done with it
// when the call returns.
func (d *Device) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuMemcpyHtoD(C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemcpyHtoD(%d bytes)", len(src)))
	}
	return d.waitLegacy("cuMemcpyHtoD")
}

// CopyDtoH copies len(dst) bytes from device memory src into dst and waits.
func (d *Device) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuMemcpyDtoH(unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst))); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemcpyDtoH(%d bytes)", len(dst)))
	}
	return nil
}

// CopyDtoD copies n bytes between device addresses (on any devices of this
// process, given unified addressing) and waits.
func (d *Device) CopyDtoD(dst, src DevicePtr, n int) error {
	if err := checkSize("cuMemcpyDtoD", d.Ordinal, n); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuMemcpyDtoD(C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n)); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemcpyDtoD(%d bytes)", n))
	}
	return d.waitLegacy("cuMemcpyDtoD")
}

// CopyHtoDAsync enqueues a copy from pinned host memory to the device.
// src must lie inside a HostBuffer from HostAlloc (checked): Go-heap memory
// could be reused before the copy runs, and a captured graph would keep its
// address.
func (d *Device) CopyHtoDAsync(dst DevicePtr, src []byte, s *Stream) error {
	if err := s.usable("cuMemcpyHtoDAsync"); err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	if !isPinned(src) {
		return fmt.Errorf("cuda: CopyHtoDAsync on device %d: source is not pinned memory from HostAlloc", d.Ordinal)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := s.issue(func() C.CUresult {
		return C.cg_cuMemcpyHtoDAsync(C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), s.handle())
	}); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemcpyHtoDAsync(%d bytes)", len(src)))
	}
	return nil
}

// CopyDtoHAsync enqueues a copy from the device into pinned host memory dst
// (which must lie inside a HostBuffer, as for CopyHtoDAsync).
func (d *Device) CopyDtoHAsync(dst []byte, src DevicePtr, s *Stream) error {
	if err := s.usable("cuMemcpyDtoHAsync"); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	if !isPinned(dst) {
		return fmt.Errorf("cuda: CopyDtoHAsync on device %d: destination is not pinned memory from HostAlloc", d.Ordinal)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := s.issue(func() C.CUresult {
		return C.cg_cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst)), s.handle())
	}); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemcpyDtoHAsync(%d bytes)", len(dst)))
	}
	return nil
}

// CopyDtoDAsync enqueues a device-to-device copy of n bytes on s.
func (d *Device) CopyDtoDAsync(dst, src DevicePtr, n int, s *Stream) error {
	if err := s.usable("cuMemcpyDtoDAsync"); err != nil {
		return err
	}
	if err := checkSize("cuMemcpyDtoDAsync", d.Ordinal, n); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := s.issue(func() C.CUresult {
		return C.cg_cuMemcpyDtoDAsync(C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s.handle())
	}); r != 0 {
		return d.err(r, fmt.Sprintf("cuMemcpyDtoDAsync(%d bytes)", n))
	}
	return nil
}

// Flags for cuMemHostAlloc.
const (
	hostAllocPortable  = 1
	hostAllocDeviceMap = 2
)

// HostBuffer is page-locked host memory from HostAlloc. Bytes is a Go view
// of C memory (not Go heap): it stays valid until Free and must not be used
// after. When mapped, DevPtr is the address kernels use to reach the same
// bytes; the host sees kernel writes through Bytes while kernels run (read
// such words with LoadUint32, which is atomic).
type HostBuffer struct {
	Bytes  []byte    // the memory, C-allocated: valid until Free
	DevPtr DevicePtr // 0 unless allocated with mapped=true
	dev    *Device
	ptr    unsafe.Pointer
	freed  atomic.Bool
}

// HostAlloc allocates bytes of pinned, portable host memory, zeroed. With
// mapped it is also mapped into the device address space
// (HostBuffer.DevPtr). The caller frees it with HostBuffer.Free.
// cuMemHostAlloc itself hands back a freed buffer's bytes: a status word
// a kernel wrote before the free then read as the new owner's (seen on an
// H100: a new communicator's first call reported the timeout of an
// aborted one's kernel).
func (d *Device) HostAlloc(bytes int, mapped bool) (*HostBuffer, error) {
	if bytes <= 0 {
		return nil, fmt.Errorf("cuda: host alloc of %d bytes on device %d: size must be positive: %w", bytes, d.Ordinal, ErrInvalidArgument)
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	flags := C.uint(hostAllocPortable)
	if mapped {
		flags |= hostAllocDeviceMap
	}
	var p unsafe.Pointer
	if r := C.cg_cuMemHostAlloc(&p, C.size_t(bytes), flags); r != 0 {
		return nil, d.err(r, fmt.Sprintf("cuMemHostAlloc(%d bytes)", bytes))
	}
	hb := &HostBuffer{Bytes: unsafe.Slice((*byte)(p), bytes), dev: d, ptr: p}
	clear(hb.Bytes)
	if mapped {
		var dp C.CUdeviceptr
		if r := C.cg_cuMemHostGetDevicePointer(&dp, p, 0); r != 0 {
			C.cg_cuMemFreeHost(p)
			return nil, d.err(r, "cuMemHostGetDevicePointer")
		}
		hb.DevPtr = DevicePtr(dp)
	}
	registerPinned(uintptr(p), bytes)
	return hb, nil
}

// LoadUint32 atomically reads the 4-byte-aligned word at byte offset off,
// e.g. a status word a running kernel writes.
func (h *HostBuffer) LoadUint32(off int) uint32 {
	_ = h.Bytes[off+3]
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&h.Bytes[off])))
}

// StoreUint32 atomically writes the 4-byte-aligned word at byte offset off.
func (h *HostBuffer) StoreUint32(off int, v uint32) {
	_ = h.Bytes[off+3]
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&h.Bytes[off])), v)
}

// Free releases the buffer; Bytes must not be used afterwards. Idempotent.
func (h *HostBuffer) Free() error {
	if h.freed.Swap(true) {
		return nil
	}
	unregisterPinned(uintptr(h.ptr))
	h.Bytes = nil
	if err := h.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuMemFreeHost(h.ptr); r != 0 {
		return h.dev.err(r, "cuMemFreeHost")
	}
	return nil
}

// pinned ranges from HostAlloc, sorted by start, for the async-copy check.
var (
	pinnedMu sync.Mutex
	pinned   []pinnedRange
)

type pinnedRange struct{ start, end uintptr }

func registerPinned(p uintptr, n int) {
	pinnedMu.Lock()
	defer pinnedMu.Unlock()
	i := sort.Search(len(pinned), func(i int) bool { return pinned[i].start >= p })
	pinned = append(pinned, pinnedRange{})
	copy(pinned[i+1:], pinned[i:])
	pinned[i] = pinnedRange{p, p + uintptr(n)}
}

func unregisterPinned(p uintptr) {
	pinnedMu.Lock()
	defer pinnedMu.Unlock()
	i := sort.Search(len(pinned), func(i int) bool { return pinned[i].start >= p })
	if i < len(pinned) && pinned[i].start == p {
		pinned = append(pinned[:i], pinned[i+1:]...)
	}
}

func isPinned(b []byte) bool {
	p := uintptr(unsafe.Pointer(&b[0]))
	end := p + uintptr(len(b))
	pinnedMu.Lock()
	defer pinnedMu.Unlock()
	i := sort.Search(len(pinned), func(i int) bool { return pinned[i].start > p })
	return i > 0 && end <= pinned[i-1].end
}

// IPCHandleSize is the size of a CUipcMemHandle.
const IPCHandleSize = 64

// IPCHandle is an exported CUDA IPC memory handle (CUipcMemHandle).
type IPCHandle [IPCHandleSize]byte

// IPCGetMemHandle exports the allocation whose base address is base, for
// another process to open with IPCOpenMemHandle. base must be the start of
// an Alloc allocation (see AddressRange).
func (d *Device) IPCGetMemHandle(base DevicePtr) (IPCHandle, error) {
	var h IPCHandle
	if err := d.enter(); err != nil {
		return h, err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuIpcGetMemHandle(unsafe.Pointer(&h[0]), C.CUdeviceptr(base)); r != 0 {
		return h, d.err(r, fmt.Sprintf("cuIpcGetMemHandle(%#x)", uintptr(base)))
	}
	return h, nil
}

// IPCOpenMemHandle maps another process's exported allocation into d's
// context (with lazy peer access enabled) and returns its base there. It
// fails for a handle exported by this same process. Close the mapping with
// IPCCloseMemHandle; the exporter must keep the allocation until then.
func (d *Device) IPCOpenMemHandle(h IPCHandle) (DevicePtr, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	const lazyEnablePeerAccess = 1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
	var p C.CUdeviceptr
	if r := C.cg_cuIpcOpenMemHandle(&p, unsafe.Pointer(&h[0]), lazyEnablePeerAccess); r != 0 {
		return 0, d.err(r, "cuIpcOpenMemHandle")
	}
	return DevicePtr(p), nil
}

// IPCCloseMemHandle unmaps a base returned by IPCOpenMemHandle.
func (d *Device) IPCCloseMemHandle(p DevicePtr) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if r := C.cg_cuIpcCloseMemHandle(C.CUdeviceptr(p)); r != 0 {
		return d.err(r, fmt.Sprintf("cuIpcCloseMemHandle(%#x)", uintptr(p)))
	}
	return nil
}
