//go:build cgo

package cuda

/*
#include "cuda_shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
)

// Local memory: a kernel's stack frame and spills live in local memory,
// which the driver reserves per context for every thread the GPU can hold
// (CU_LIMIT_STACK_SIZE bytes each). A launch of a kernel that needs more
// than the reservation grows it first (CUDA keeps the grown size), and
// the kernel starts only once every kernel of the context has ended
// (TestReserveStackGPU: a kernel spinning for it is waited for). Where the
// context's kernels wait for each other, as those of ranks sharing one GPU
// do, the kernel behind the growth waits for kernels that wait for it,
// until their timeout (docs/reliability.md, case 99). ReserveStack grows
// it ahead.

const (
	funcAttrLocalSizeBytes = 3 // CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
	limitStackSize         = 0 // CU_LIMIT_STACK_SIZE
)

// stackMu orders ReserveStack's read and growth of the reservation between
// goroutines: the devices of one ordinal share the primary context, and two
// unordered growths could leave the smaller.
var stackMu sync.Mutex

// LocalBytes returns the local memory each thread of f uses: its stack
// frame and spills (CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES). A kernel that
// needs more than the context's reservation grows it at its launch
// (Device.ReserveStack).
func (f *Function) LocalBytes() (int, error) {
	d := f.mod.dev
	if f.mod.m == nil {
		return 0, fmt.Errorf("cuda: local memory of %s on device %d: its module was unloaded (Module.Unload): %w", f.Name, d.Ordinal, ErrInvalidArgument)
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	var v C.int
	if r := C.cg_cuFuncGetAttribute(&v, funcAttrLocalSizeBytes, f.f); r != 0 {
		return 0, d.err(r, fmt.Sprintf("cuFuncGetAttribute(%s, local size)", f.Name))
	}
	return int(v), nil
}

// StackBytes returns the per-thread local memory d's context reserves
// (CU_LIMIT_STACK_SIZE).
func (d *Device) StackBytes() (int, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	return d.stackBytes()
}

// stackBytes is StackBytes with the context current.
func (d *Device) stackBytes() (int, error) {
	var v C.size_t
	if r := C.cg_cuCtxGetLimit(&v, limitStackSize); r != 0 {
		return 0, d.err(r, "cuCtxGetLimit(stack size)")
	}
	return int(v), nil
}

// ReserveStack grows the per-thread local memory d's context reserves to
// at least n bytes, so that no later launch of a kernel using up to n
// bytes (Function.LocalBytes) grows it. A reservation already that large
// is left as it is, and nothing waits; a growth waits, like the launch
// that would have made it, for every kernel of the context: call it
// before kernels that may wait for each other run. It costs n bytes for
// every thread the GPU holds at once.
func (d *Device) ReserveStack(n int) error {
	if n < 0 {
		return fmt.Errorf("cuda: reserve %d bytes of stack on device %d: %w", n, d.Ordinal, ErrInvalidArgument)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	stackMu.Lock()
	defer stackMu.Unlock()
	have, err := d.stackBytes()
	if err != nil || have >= n {
		return err
	}
	if r := C.cg_cuCtxSetLimit(limitStackSize, C.size_t(n)); r != 0 {
		return d.err(r, fmt.Sprintf("cuCtxSetLimit(stack size, %d bytes; was %d)", n, have))
	}
	return nil
}
