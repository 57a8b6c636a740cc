//go:build cgo

package cuda

/*
#cgo CFLAGS: -O2 -std=gnu11
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "cuda_shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/collgen/collgen/runtime/internal/dl"
)

// Environment variables that override where the shared libraries are found.
// Each may name a library file or a directory holding it. When set, only
// that location is tried: a bad override is an error, never a silent
// fallback to the system library.
const (
	EnvCUDAPath  = "COLLGEN_CUDA_PATH"
	EnvNVRTCPath = "COLLGEN_NVRTC_PATH"
)

// cudaLibDirs are the CUDA toolkit directories searched (after the dynamic
// linker's own search) for libnvrtc.
var cudaLibDirs = []string{
	"/usr/local/cuda/lib64",
	"/usr/local/cuda/targets/x86_64-linux/lib",
	"/usr/local/cuda/targets/sbsa-linux/lib",
	"/usr/lib/x86_64-linux-gnu",
	"/usr/lib64",
}

// LibraryError reports a shared library that could not be loaded or lacks a
// required symbol (libcuda, libnvrtc; runtime/nccl's is the same type).
type LibraryError = dl.LibraryError

// requiredCU are the driver symbols without which nothing works; the others
// fail only the call that needs them, with an error naming the symbol.
var requiredCU = []int{C.CG_cuInit, C.CG_cuGetErrorName, C.CG_cuDeviceGet, C.CG_cuDeviceGetCount,
	C.CG_cuDevicePrimaryCtxRetain, C.CG_cuCtxSetCurrent, C.CG_cuMemAlloc}

var (
	driverMu     sync.Mutex
	driverLoaded bool
	driverPath   string
	driverInit   error // cuInit's result, returned by every later loadDriver
	driverQueues int   // the work queues of this process's contexts (askWorkQueues)
	driverMPS    bool  // an MPS control daemon's pipe was there at cuInit (mpsPipe)
)

// loadDriverFrom opens libcuda as spec says and checks the required
// symbols without installing anything; on success it returns the resolved
// table (C memory the caller must free) and the library (the caller closes
// it when it does not install the table).
func loadDriverFrom(spec dl.Spec) (unsafe.Pointer, *dl.Library, error) {
	l, err := dl.Open(spec)
	if err != nil {
		return nil, nil, err
	}
	tbl := C.malloc(C.size_t(C.CG_CU_COUNT) * C.size_t(unsafe.Sizeof(uintptr(0))))
	C.cg_cu_resolve(l.Handle(), (*unsafe.Pointer)(tbl))
	entries := unsafe.Slice((*unsafe.Pointer)(tbl), int(C.CG_CU_COUNT))
	for _, i := range requiredCU {
		if entries[i] == nil {
			C.free(tbl)
			l.Close()
			return nil, nil, l.Missing(C.GoString(C.cg_cu_symbol(C.int(i))), "not a usable CUDA driver library")
		}
	}
	return tbl, l, nil
}

// driverSpec is where libcuda is looked for.
func driverSpec() dl.Spec {
	return dl.Spec{Lib: "libcuda", Env: EnvCUDAPath, Sonames: []string{"libcuda.so.1", "libcuda.so"},
		Hint: "install the NVIDIA driver, or set " + EnvCUDAPath + " to its libcuda.so.1; for CPU ranks use the host backend"}
}

// loadDriver loads libcuda once per process (a failure is retried on the
// next call, so a test can fix the environment) and runs cuInit(0).
func loadDriver() error {
	driverMu.Lock()
	defer driverMu.Unlock()
	if driverLoaded {
		return driverInit
	}
	tbl, lib, err := loadDriverFrom(driverSpec())
	if err != nil {
		return err
	}
	C.cg_cu_commit((*unsafe.Pointer)(tbl))
	C.free(tbl)
	// The library is deliberately never closed: function pointers into it
	// live in the global table for the life of the process.
	driverLoaded, driverPath = true, lib.Path
	driverQueues, driverMPS = askWorkQueues()
	if r := C.cg_cuInit(0); r != 0 {
		driverInit = newError(r, "cuInit", -1)
	}
	return driverInit
}

// DriverPath returns the libcuda path or soname that was loaded ("" before
// the first successful load).
func DriverPath() string {
	driverMu.Lock()
	defer driverMu.Unlock()
	return driverPath
}

// WorkQueues returns the hardware work queues each CUDA context of this
// process gets (EnvMaxConnections as the driver was initialized: 32
// unless the process set the variable or an MPS control daemon runs, see
// UnderMPS), or 0 before the driver is loaded.
// If other code of the process initialized CUDA first, its contexts may
// have what the variable said then.
func WorkQueues() int {
	driverMu.Lock()
	defer driverMu.Unlock()
	return driverQueues
}

// UnderMPS reports whether an MPS control daemon's pipe was there when the
// driver was initialized (so this process's contexts are likely MPS
// clients and kept CUDA's default work queues; see askWorkQueues); false
// before the driver is loaded.
func UnderMPS() bool {
	driverMu.Lock()
	defer driverMu.Unlock()
	return driverMPS
}

// Init loads libcuda and initialises the driver. Every other function calls
// it as needed; calling it explicitly only surfaces the error early.
func Init() error { return loadDriver() }

// DriverVersion returns the driver's CUDA version (e.g. 13000 for 13.0).
func DriverVersion() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var v C.int
	if r := C.cg_cuDriverGetVersion(&v); r != 0 {
		return 0, newError(r, "cuDriverGetVersion", -1)
	}
	return int(v), nil
}

var (
	nvrtcMu     sync.Mutex
	nvrtcLoaded bool
	nvrtcPath   string
	nvrtcMajor  int
	nvrtcMinor  int
	nvrtcBuild  string // libraryBuild of the loaded file, for cache keys
)

// nvrtcSonames lists NVRTC sonames newest first; unversioned last.
var nvrtcSonames = []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so.11.1", "libnvrtc.so.11.0", "libnvrtc.so"}

// nvrtcSpec is where NVRTC is looked for: the sonames, then toolkit
// directories, then versioned names not in the list (libnvrtc.so.13.1 ...),
// newest first.
func nvrtcSpec() dl.Spec {
	dirs := append([]string(nil), cudaLibDirs...)
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if v := os.Getenv(env); v != "" {
			dirs = append([]string{filepath.Join(v, "lib64"), filepath.Join(v, "lib")}, dirs...)
		}
	}
	var extra []string
	for _, d := range dirs {
		m, _ := filepath.Glob(filepath.Join(d, "libnvrtc.so.*"))
		extra = append(extra, m...)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(extra)))
	return dl.Spec{Lib: "libnvrtc", Env: EnvNVRTCPath, Sonames: nvrtcSonames, Dirs: dirs, Extra: extra,
		Hint: "install the CUDA toolkit's NVRTC (or set " + EnvNVRTCPath + "), or load kernels from a fatbin (Config.FatbinPath)"}
}

// preloadBuiltins opens libnvrtc-builtins from the directory NVRTC came
// from, globally, so NVRTC's own dlopen of it (by soname) finds it even
// when that directory is not on the linker path. Best effort: errors are
// ignored, and the library stays open for the life of the process.
func preloadBuiltins(nvrtc string) {
	if !strings.Contains(nvrtc, "/") {
		return
	}
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(nvrtc), "libnvrtc-builtins.so*"))
	sort.Sort(sort.Reverse(sort.StringSlice(m)))
	dl.Open(dl.Spec{Lib: "libnvrtc-builtins", Extra: m, Global: true})
}

// loadNVRTCFrom opens NVRTC as spec says and resolves its symbols (all are
// required) without installing them.
func loadNVRTCFrom(spec dl.Spec) (unsafe.Pointer, *dl.Library, error) {
	l, err := dl.Open(spec)
	if err != nil {
		return nil, nil, err
	}
	tbl := C.malloc(C.size_t(C.CG_NVRTC_COUNT) * C.size_t(unsafe.Sizeof(uintptr(0))))
	C.cg_nvrtc_resolve(l.Handle(), (*unsafe.Pointer)(tbl))
	entries := unsafe.Slice((*unsafe.Pointer)(tbl), int(C.CG_NVRTC_COUNT))
	for i, e := range entries {
		if e == nil {
			C.free(tbl)
			l.Close()
			return nil, nil, l.Missing(C.GoString(C.cg_nvrtc_symbol(C.int(i))), "not a usable NVRTC library")
		}
	}
	preloadBuiltins(l.Path)
	return tbl, l, nil
}

// loadNVRTC loads NVRTC once per process (failures are retried).
func loadNVRTC() error {
	nvrtcMu.Lock()
	defer nvrtcMu.Unlock()
	if nvrtcLoaded {
		return nil
	}
	tbl, lib, err := loadNVRTCFrom(nvrtcSpec())
	if err != nil {
		return err
	}
	path := lib.Path
	build := libraryBuild(lib.File("nvrtcVersion"))
	C.cg_nvrtc_commit((*unsafe.Pointer)(tbl))
	C.free(tbl)
	var maj, min C.int
	if r := C.cg_nvrtcVersion(&maj, &min); r != 0 {
		return fmt.Errorf("cuda: nvrtcVersion: %s", nvrtcErrString(r))
	}
	nvrtcLoaded, nvrtcPath, nvrtcMajor, nvrtcMinor, nvrtcBuild = true, path, int(maj), int(min), build
	return nil
}

// nvrtcCompiler names the loaded NVRTC in cache keys (see Cache.Key): its
// version and the build of its library file. An NVRTC whose file cannot
// be identified has no key (its images are not cached).
func nvrtcCompiler() (string, error) {
	if err := loadNVRTC(); err != nil {
		return "", err
	}
	nvrtcMu.Lock()
	defer nvrtcMu.Unlock()
	if nvrtcBuild == "" {
		return "", fmt.Errorf("cuda: cannot find the file NVRTC %d.%d was loaded from (%s): its images are not cached", nvrtcMajor, nvrtcMinor, nvrtcPath)
	}
	return nvrtcName(nvrtcMajor, nvrtcMinor, nvrtcBuild), nil
}

// NVRTCVersion loads NVRTC if needed and returns its version and path.
func NVRTCVersion() (major, minor int, path string, err error) {
	if err := loadNVRTC(); err != nil {
		return 0, 0, "", err
	}
	nvrtcMu.Lock()
	defer nvrtcMu.Unlock()
	return nvrtcMajor, nvrtcMinor, nvrtcPath, nil
}

// ErrNoDevice is returned (wrapped) when the driver loads but reports no
// CUDA device.
var ErrNoDevice = errors.New("cuda: no CUDA device")

// freeTable frees a table returned by loadDriverFrom or loadNVRTCFrom.
func freeTable(tbl unsafe.Pointer) { C.free(tbl) }
