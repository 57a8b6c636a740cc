package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// This file holds what builds without cgo: the types CPU-only programs
// name (through runtime/comm's API) and the pure parts of NVRTC's option
// handling, which the cache key hashes.

// DevicePtr is a device address (CUdeviceptr). With unified addressing it
// is unique across the devices of a process, so a peer's pointer can be
// used directly once peer access is enabled.
type DevicePtr uintptr

// ErrInvalidArgument is wrapped by refusals of a call's own arguments
// that the driver is never asked about: a negative or zero size where a
// positive one is needed, a negative shared-memory size, a stream or
// module used after Destroy or Unload. The message names the call, the
// device and the value.
var ErrInvalidArgument = errors.New("invalid argument")

// checkSize refuses a negative size n (bytes, words) of call op on device
// dev: converted to C's size_t it would reach the driver as a size near
// 2^64.
func checkSize(op string, dev int, n int) error {
	if n < 0 {
		return fmt.Errorf("cuda: %s on device %d: size %d is negative: %w", op, dev, n, ErrInvalidArgument)
	}
	return nil
}

// CompileRequest is one CUDA C++ translation unit for NVRTC.
type CompileRequest struct {
	Name    string            // program name, used in diagnostics (e.g. "allreduce_f32.cu")
	Source  string            // CUDA C++ source
	Headers map[string]string // include name -> contents, for #include "name"
	Options []string          // extra NVRTC options (e.g. "--std=c++17", "-DN=4")
	Arch    int               // compute capability as 90 for sm_90; 0 = caller must set (LoadSource uses the device's)
}

// CompileError is an NVRTC compilation failure with the compiler log.
type CompileError struct {
	Name   string // the program's name
	Arch   int    // the target, as 90 for sm_90
	Result string // NVRTC result name, e.g. NVRTC_ERROR_COMPILATION
	Log    string // NVRTC's program log
	Hint   string // what to do, when known (an NVRTC that does not know Arch)
}

// Error gives the program, target, NVRTC result, hint and the compile log.
func (e *CompileError) Error() string {
	hint := ""
	if e.Hint != "" {
		hint = " (" + e.Hint + ")"
	}
	return fmt.Sprintf("cuda: nvrtc compile of %s for sm_%d failed: %s%s\n%s", e.Name, e.Arch, e.Result, hint, strings.TrimSpace(e.Log))
}

// hasArchOption reports whether opts already choose a target architecture.
func hasArchOption(opts []string) bool {
	for _, o := range opts {
		if strings.HasPrefix(o, "--gpu-architecture") || strings.HasPrefix(o, "-arch") {
			return true
		}
	}
	return false
}

// cudaIncludeDir finds the toolkit include directory next to the loaded
// NVRTC (for cuda_fp16.h, cuda_bf16.h, cuda_fp8.h), or "" if none.
func cudaIncludeDir() string {
	_, _, path, err := NVRTCVersion()
	if err != nil {
		return ""
	}
	var dirs []string
	if strings.Contains(path, "/") {
		lib := filepath.Dir(path)
		dirs = append(dirs, filepath.Join(lib, "..", "include"), filepath.Join(lib, "..", "..", "include"))
	}
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if v := os.Getenv(env); v != "" {
			dirs = append(dirs, filepath.Join(v, "include"))
		}
	}
	dirs = append(dirs, "/usr/local/cuda/include", "/usr/local/cuda/targets/x86_64-linux/include")
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "cuda_fp16.h")); err == nil {
			return filepath.Clean(d)
		}
	}
	return ""
}

// needsToolkitHeaders reports whether the program includes a toolkit
// header (<cuda_fp16.h> and friends); only then is the toolkit include
// directory added, since NVRTC's built-in headers cover the rest.
func needsToolkitHeaders(req CompileRequest) bool {
	if strings.Contains(req.Source, "<cuda") {
		return true
	}
	for _, h := range req.Headers {
		if strings.Contains(h, "<cuda") {
			return true
		}
	}
	return false
}

// effectiveOptions returns the options Compile passes: the request's, plus
// --gpu-architecture=sm_<Arch> unless given, plus the toolkit include
// directory when the program includes toolkit headers and one is found. The cache key hashes exactly these.
func effectiveOptions(req CompileRequest) []string {
	opts := append([]string(nil), req.Options...)
	if !hasArchOption(opts) && req.Arch > 0 {
		opts = append(opts, fmt.Sprintf("--gpu-architecture=sm_%d", req.Arch))
	}
	if needsToolkitHeaders(req) {
		if inc := cudaIncludeDir(); inc != "" {
			opts = append(opts, "--include-path="+inc)
		}
	}
	return opts
}
