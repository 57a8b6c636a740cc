//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "cuda_shim.h"
*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"unsafe"
)

// Module is loaded device code (cubin, fatbin or PTX) in one device's
// context. Functions from it are valid until Unload.
type Module struct {
	dev *Device
	m   C.CUmodule
	// Origin says where the code came from: "image", "fatbin:<path>",
	// "nvrtc" (compiled now) or "nvrtc-cache" (loaded from the disk cache).
	Origin string

	mu    sync.Mutex
	funcs map[string]*Function
}

// LoadModule loads a cubin, fatbin or NUL-terminated PTX image into d's
// context. The image is copied to C memory first (the driver wants it
// aligned and does not keep it), so the caller keeps ownership of image.
func (d *Device) LoadModule(image []byte) (*Module, error) {
	return d.loadModule(image, "image")
}

func (d *Device) loadModule(image []byte, origin string) (*Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("cuda: load module on device %d: empty image", d.Ordinal)
	}
	cimg := C.CBytes(image) // malloc: 16-byte aligned
	defer C.free(cimg)
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	m := &Module{dev: d, Origin: origin, funcs: map[string]*Function{}}
	if r := C.cg_cuModuleLoadData(&m.m, cimg); r != 0 {
		return nil, d.err(r, fmt.Sprintf("cuModuleLoadData(%s, %d bytes)", origin, len(image)))
	}
	return m, nil
}

// LoadFatbinFile loads a fatbin (or cubin) built by nvcc, e.g. by
// `collgen fatbin` or `make fatbin`. A missing or unreadable file is a *FatbinError over the
// file error (errors.Is(err, fs.ErrNotExist) for a missing one); see
// LoadFatbin for the rest.
func (d *Device) LoadFatbinFile(path string) (*Module, error) {
	img, err := os.ReadFile(path)
	if err != nil {
		return nil, &FatbinError{Fatbin: path, Device: d.Ordinal, Arch: d.Arch(), Err: err}
	}
	return d.LoadFatbin(img, path)
}

// LoadFatbin loads a fatbin image; name says where it came from (a path,
// or "embedded") in Module.Origin ("fatbin:<name>") and errors. A fatbin
// with no code the device runs is a *FatbinError listing what it holds
// (over the driver's CUDA_ERROR_NO_BINARY_FOR_GPU).
func (d *Device) LoadFatbin(image []byte, name string) (*Module, error) {
	m, err := d.loadModule(image, "fatbin:"+name)
	if err != nil {
		if fe := fatbinMismatch(name, image, d.Ordinal, d.Arch(), err); fe != nil {
			return nil, fe
		}
		return nil, err
	}
	return m, nil
}

// Device returns the module's device.
func (m *Module) Device() *Device { return m.dev }

// Unload releases the module; its Functions become invalid: launching
// one, or looking one up, fails with ErrInvalidArgument (a cached
// Function's CUfunction would otherwise name freed driver state).
// Idempotent. Not safe concurrently with launches of its Functions: the
// owner unloads once they have stopped.
func (m *Module) Unload() error {
	if m == nil {
		return nil
	}
	m.mu.Lock() // against Function's lookups
	defer m.mu.Unlock()
	if m.m == nil {
		return nil
	}
	if err := m.dev.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	r := C.cg_cuModuleUnload(m.m)
	m.m = nil
	if r != 0 {
		return m.dev.err(r, "cuModuleUnload")
	}
	return nil
}

// Function is a kernel of a Module.
type Function struct {
	Name string // the kernel's symbol in its module
	mod  *Module
	f    C.CUfunction

	mu        sync.Mutex
	maxShared int // dynamic shared memory the attribute currently allows
}

// Function looks up an extern "C" kernel by name (cached per module).
func (m *Module) Function(name string) (*Function, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		return nil, fmt.Errorf("cuda: function %q on device %d: the module was unloaded (Module.Unload): %w", name, m.dev.Ordinal, ErrInvalidArgument)
	}
	if f := m.funcs[name]; f != nil {
		return f, nil
	}
	if err := m.dev.enter(); err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	f := &Function{Name: name, mod: m, maxShared: defaultMaxDynShared}
	if r := C.cg_cuModuleGetFunction(&f.f, m.m, cs); r != 0 {
		return nil, m.dev.err(r, fmt.Sprintf("cuModuleGetFunction(%q)", name))
	}
	m.funcs[name] = f
	return f, nil
}

// Launch looks up kernel name and launches it; see Function.Launch.
func (m *Module) Launch(name string, grid, block [3]uint32, sharedBytes int, s *Stream, args []byte) error {
	f, err := m.Function(name)
	if err != nil {
		return err
	}
	return f.Launch(grid, block, sharedBytes, s, args)
}

const (
	defaultMaxDynShared               = 48 * 1024
	funcAttrMaxDynamicSharedSizeBytes = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
)

// Launch enqueues the kernel on s (nil: legacy default stream) with the
// given grid and block dimensions (zeros count as 1) and dynamic shared
// memory. args is the raw bytes of the kernel's single by-value struct
// parameter, laid out as the C struct (the generated registry's
// collgen_args_* types); empty args means a kernel with no parameters.
// Dynamic shared memory over 48 KiB raises the function's limit first.
func (f *Function) Launch(grid, block [3]uint32, sharedBytes int, s *Stream, args []byte) error {
	return f.launch(grid, block, sharedBytes, s, args, false)
}

// LaunchEarly is Launch with programmatic dependent launch: the kernel may
// be scheduled before the kernel ahead of it on s has finished, so its
// launch overlaps that kernel's tail (graph capture records the
// programmatic edge). The kernel must start with griddepcontrol.wait
// before it touches global memory (collgen's kernels do: cg_grid_begin).
// It fails on a device or driver without the feature; check
// Device.EarlyLaunch first.
func (f *Function) LaunchEarly(grid, block [3]uint32, sharedBytes int, s *Stream, args []byte) error {
	if !f.mod.dev.EarlyLaunch() {
		return fmt.Errorf("cuda: early launch of %s on device %d: needs compute capability 9.0 (device has %d.%d) and a driver with cuLaunchKernelEx (CUDA 12.0)",
			f.Name, f.mod.dev.Ordinal, f.mod.dev.Major, f.mod.dev.Minor)
	}
	return f.launch(grid, block, sharedBytes, s, args, true)
}

// EarlyLaunch reports whether Function.LaunchEarly works on d: compute
// capability 9.0 or later (griddepcontrol) and a driver that exports
// cuLaunchKernelEx.
func (d *Device) EarlyLaunch() bool { return d.early }

func (f *Function) launch(grid, block [3]uint32, sharedBytes int, s *Stream, args []byte, early bool) error {
	d := f.mod.dev
	if f.mod.m == nil {
		return fmt.Errorf("cuda: launch %s on device %d: its module was unloaded (Module.Unload): %w", f.Name, d.Ordinal, ErrInvalidArgument)
	}
	if err := s.usable("launch " + f.Name); err != nil {
		return err
	}
	if sharedBytes < 0 || uint64(sharedBytes) > math.MaxUint32 {
		return fmt.Errorf("cuda: launch %s on device %d: dynamic shared memory of %d bytes: want 0 to %d: %w", f.Name, d.Ordinal, sharedBytes, uint32(math.MaxUint32), ErrInvalidArgument)
	}
	if s != nil && s.dev != d {
		return fmt.Errorf("cuda: launch %s on device %d: stream belongs to device %d", f.Name, d.Ordinal, s.dev.Ordinal)
	}
	for i := range 3 {
		if grid[i] == 0 {
			grid[i] = 1
		}
		if block[i] == 0 {
			block[i] = 1
		}
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if sharedBytes > defaultMaxDynShared {
		f.mu.Lock()
		if sharedBytes > f.maxShared {
			if r := C.cg_cuFuncSetAttribute(f.f, funcAttrMaxDynamicSharedSizeBytes, C.int(sharedBytes)); r != 0 {
				f.mu.Unlock()
				return d.err(r, fmt.Sprintf("cuFuncSetAttribute(%s, max dynamic shared %d)", f.Name, sharedBytes))
			}
			f.maxShared = sharedBytes
		}
		f.mu.Unlock()
	}
	var argp unsafe.Pointer
	if len(args) > 0 {
		argp = unsafe.Pointer(&args[0])
	}
	r := s.issue(func() C.CUresult {
		return C.cg_launch(f.f, C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
			C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(sharedBytes),
			s.handle(), argp, C.size_t(len(args)), C.int(boolInt(early)))
	})
	if r != 0 {
		call := "cuLaunchKernel"
		if early {
			call = "cuLaunchKernelEx(programmatic stream serialization)"
		}
		return d.err(r, fmt.Sprintf("%s(%s, grid %v, block %v, shared %d, %d arg bytes)",
			call, f.Name, grid, block, sharedBytes, len(args)))
	}
	return nil
}

// Dim3 converts ints to a launch dimension; missing trailing values are 1.
func Dim3(v ...int) [3]uint32 {
	d := [3]uint32{1, 1, 1}
	for i := 0; i < len(v) && i < 3; i++ {
		d[i] = uint32(v[i])
	}
	return d
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
