//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "cuda_shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"unsafe"
)

// Compile compiles req with NVRTC for sm_<req.Arch> and returns a CUBIN, or
// NUL-terminated PTX (which LoadModule JIT-compiles) when this NVRTC cannot
// produce a CUBIN. A compile failure is a *CompileError with the log. ctx
// is checked before compiling; NVRTC itself cannot be interrupted.
func Compile(ctx context.Context, req CompileRequest) ([]byte, error) {
	image, _, err := compile(ctx, req)
	return image, err
}

// compile returns the image and whether it is a CUBIN (else PTX).
func compile(ctx context.Context, req CompileRequest) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	if req.Arch <= 0 && !hasArchOption(req.Options) {
		return nil, false, fmt.Errorf("cuda: nvrtc compile of %s: no target architecture (set CompileRequest.Arch)", req.Name)
	}
	if err := loadNVRTC(); err != nil {
		return nil, false, err
	}
	name := req.Name
	if name == "" {
		name = "collgen.cu"
	}
	opts := effectiveOptions(req)

	var cfree []unsafe.Pointer
	defer func() {
		for _, p := range cfree {
			C.free(p)
		}
	}()
	cstr := func(s string) *C.char {
		p := C.CString(s)
		cfree = append(cfree, unsafe.Pointer(p))
		return p
	}
	carray := func(ss []string) **C.char {
		if len(ss) == 0 {
			return nil
		}
		arr := C.malloc(C.size_t(len(ss)) * C.size_t(unsafe.Sizeof(uintptr(0))))
		cfree = append(cfree, arr)
		v := unsafe.Slice((**C.char)(arr), len(ss))
		for i, s := range ss {
			v[i] = cstr(s)
		}
		return (**C.char)(arr)
	}
	hnames := make([]string, 0, len(req.Headers))
	for n := range req.Headers {
		hnames = append(hnames, n)
	}
	sort.Strings(hnames)
	hbodies := make([]string, len(hnames))
	for i, n := range hnames {
		hbodies[i] = req.Headers[n]
	}

	var prog C.nvrtcProgram
	if r := C.cg_nvrtcCreateProgram(&prog, cstr(req.Source), cstr(name), C.int(len(hnames)),
		carray(hbodies), carray(hnames)); r != 0 {
		return nil, false, fmt.Errorf("cuda: nvrtcCreateProgram(%s): %s", name, nvrtcErrString(r))
	}
	defer C.cg_nvrtcDestroyProgram(&prog)

	arch := req.Arch
	if r := C.cg_nvrtcCompileProgram(prog, C.int(len(opts)), carray(opts)); r != 0 {
		ce := &CompileError{Name: name, Arch: arch, Result: nvrtcErrString(r), Log: programLog(prog)}
		if ce.Result == "NVRTC_ERROR_INVALID_OPTION" && strings.Contains(ce.Log, "--gpu-architecture") { // NVRTC older than the GPU
			maj, min, path, _ := NVRTCVersion()
			ce.Hint = fmt.Sprintf("NVRTC %d.%d (%s) does not know this architecture: install a CUDA toolkit whose NVRTC does, or set %s to one, or load kernels from a fatbin built for sm_%d",
				maj, min, path, EnvNVRTCPath, arch)
		}
		return nil, false, ce
	}
	var n C.size_t
	if r := C.cg_nvrtcGetCUBINSize(prog, &n); r == 0 && n > 0 {
		out := make([]byte, int(n))
		if r := C.cg_nvrtcGetCUBIN(prog, (*C.char)(unsafe.Pointer(&out[0]))); r != 0 {
			return nil, false, fmt.Errorf("cuda: nvrtcGetCUBIN(%s): %s", name, nvrtcErrString(r))
		}
		return out, true, nil
	}
	// No CUBIN (virtual architecture, or an NVRTC without nvrtcGetCUBIN
	// support for this target): fall back to PTX for the driver to JIT.
	if r := C.cg_nvrtcGetPTXSize(prog, &n); r != 0 || n == 0 {
		return nil, false, fmt.Errorf("cuda: nvrtcGetPTXSize(%s): %s", name, nvrtcErrString(r))
	}
	out := make([]byte, int(n)) // n includes the terminating NUL
	if r := C.cg_nvrtcGetPTX(prog, (*C.char)(unsafe.Pointer(&out[0]))); r != 0 {
		return nil, false, fmt.Errorf("cuda: nvrtcGetPTX(%s): %s", name, nvrtcErrString(r))
	}
	if out[len(out)-1] != 0 {
		out = append(out, 0)
	}
	return out, false, nil
}

func programLog(prog C.nvrtcProgram) string {
	var n C.size_t
	if C.cg_nvrtcGetProgramLogSize(prog, &n) != 0 || n <= 1 {
		return ""
	}
	buf := make([]byte, int(n))
	if C.cg_nvrtcGetProgramLog(prog, (*C.char)(unsafe.Pointer(&buf[0]))) != 0 {
		return ""
	}
	return strings.TrimRight(string(buf), "\x00")
}
