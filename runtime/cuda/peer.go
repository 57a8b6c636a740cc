//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "cuda_shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// CanAccessPeerBusID reports whether kernels on d can access memory of the
// GPU at a PCI bus id (as Device.PCIBusID reports it in any process),
// without opening that GPU: no context is created on it. A GPU this
// process cannot see (CUDA_VISIBLE_DEVICES hides it) is an error from
// cuDeviceGetByPCIBusId.
func (d *Device) CanAccessPeerBusID(bus string) (bool, error) {
	if bus == d.PCIBusID {
		return true, nil
	}
	cs := C.CString(bus)
	defer C.free(unsafe.Pointer(cs))
	var peer C.CUdevice
	if r := C.cg_cuDeviceGetByPCIBusId(&peer, cs); r != 0 {
		return false, d.err(r, fmt.Sprintf("cuDeviceGetByPCIBusId(%s)", bus))
	}
	if peer == d.dev {
		return true, nil
	}
	var can C.int
	if r := C.cg_cuDeviceCanAccessPeer(&can, d.dev, peer); r != 0 {
		return false, d.err(r, fmt.Sprintf("cuDeviceCanAccessPeer(%s)", bus))
	}
	return can != 0, nil
}
