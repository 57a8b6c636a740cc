//go:build linux && (amd64 || arm64)

package symm

import _ "embed"

// DeviceHeaderName is the name under which kernels include DeviceHeader:
// #include "collgen_symm.cuh".
const DeviceHeaderName = "collgen_symm.cuh"

// DeviceHeader is collgen_symm.cuh, the device side of symmetric memory for
// kernels: the cg_symm_group argument (Handle.KernelGroup builds it) and
// cg_symm_put, cg_symm_wait and cg_symm_barrier on the signal pads, with
// deadlines reported through a StreamOrdering's status words. It is the
// same file `collgen generate` writes to generated/cuda/ (from
// templates/cuda/symm.cuh.tmpl; a test keeps the two equal), and what
// CompileKernel lets a kernel include.
//
//go:embed kernels/collgen_symm.cuh
var DeviceHeader string

// signalSource is the kernel behind stream-ordered signals on the CUDA
// backend (cg_symm_signal; cuda_signal.go lays out its argument).
//
//go:embed kernels/signal.cu
var signalSource string
