// abi_check.c checks the hand-declared CUDA driver, NVRTC and NCCL ABI in
// runtime/cuda/cuda_shim.h and runtime/nccl/nccl_shim.h against the real
// headers on the GPU machine: prototypes (compile-time type checks), struct
// sizes and enum values (static asserts), and which exported symbol each
// API name maps to (printed; a mismatch is reported, not fatal, since the
// driver keeps exporting older versions with their old semantics).
//
// Build and run there: gcc -I/usr/local/cuda/include tests/gpu/abi_check.c -o /tmp/abi && /tmp/abi
#include <cuda.h>
#include <nccl.h>
#include <nvrtc.h>
#include <stdio.h>
#include <limits.h>
#include <string.h>

#define STR(x) #x
#define XSTR(x) STR(x)
#define SAME(a, b) __builtin_types_compatible_p(a, b)
#define CHECK_TYPE(fn, type) _Static_assert(SAME(__typeof__(&fn), type), #fn " prototype differs")

static int mismatches;
static void sym(const char *api, const char *mapped, const char *ours) {
  int ok = strcmp(mapped, ours) == 0;
  if (!ok) mismatches++;
  printf("%-28s header -> %-32s shim dlsym %-32s %s\n", api, mapped, ours, ok ? "ok" : "DIFFERENT");
}
#define SYM(api, ours) sym(#api, XSTR(api), ours)

// Prototypes as the shim calls them.
CHECK_TYPE(cuInit, CUresult (*)(unsigned int));
CHECK_TYPE(cuDriverGetVersion, CUresult (*)(int *));
CHECK_TYPE(cuGetErrorName, CUresult (*)(CUresult, const char **));
CHECK_TYPE(cuDeviceGetCount, CUresult (*)(int *));
CHECK_TYPE(cuDeviceGet, CUresult (*)(CUdevice *, int));
CHECK_TYPE(cuDeviceGetName, CUresult (*)(char *, int, CUdevice));
CHECK_TYPE(cuDeviceGetAttribute, CUresult (*)(int *, CUdevice_attribute, CUdevice));
CHECK_TYPE(cuDeviceGetPCIBusId, CUresult (*)(char *, int, CUdevice));
CHECK_TYPE(cuDeviceGetByPCIBusId, CUresult (*)(CUdevice *, const char *));
CHECK_TYPE(cuDeviceTotalMem, CUresult (*)(size_t *, CUdevice));
CHECK_TYPE(cuDevicePrimaryCtxRetain, CUresult (*)(CUcontext *, CUdevice));
CHECK_TYPE(cuDevicePrimaryCtxRelease, CUresult (*)(CUdevice));
CHECK_TYPE(cuCtxSetCurrent, CUresult (*)(CUcontext));
CHECK_TYPE(cuCtxSynchronize, CUresult (*)(void));
CHECK_TYPE(cuMemGetInfo, CUresult (*)(size_t *, size_t *));
CHECK_TYPE(cuMemAlloc, CUresult (*)(CUdeviceptr *, size_t));
CHECK_TYPE(cuMemFree, CUresult (*)(CUdeviceptr));
CHECK_TYPE(cuMemHostAlloc, CUresult (*)(void **, size_t, unsigned int));
CHECK_TYPE(cuMemFreeHost, CUresult (*)(void *));
CHECK_TYPE(cuMemHostGetDevicePointer, CUresult (*)(CUdeviceptr *, void *, unsigned int));
CHECK_TYPE(cuMemcpyHtoD, CUresult (*)(CUdeviceptr, const void *, size_t));
CHECK_TYPE(cuMemcpyDtoH, CUresult (*)(void *, CUdeviceptr, size_t));
CHECK_TYPE(cuMemcpyDtoD, CUresult (*)(CUdeviceptr, CUdeviceptr, size_t));
CHECK_TYPE(cuMemcpyHtoDAsync, CUresult (*)(CUdeviceptr, const void *, size_t, CUstream));
CHECK_TYPE(cuMemcpyDtoHAsync, CUresult (*)(void *, CUdeviceptr, size_t, CUstream));
CHECK_TYPE(cuMemcpyDtoDAsync, CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream));
CHECK_TYPE(cuMemsetD8, CUresult (*)(CUdeviceptr, unsigned char, size_t));
CHECK_TYPE(cuMemsetD32, CUresult (*)(CUdeviceptr, unsigned int, size_t));
CHECK_TYPE(cuMemsetD8Async, CUresult (*)(CUdeviceptr, unsigned char, size_t, CUstream));
CHECK_TYPE(cuMemsetD32Async, CUresult (*)(CUdeviceptr, unsigned int, size_t, CUstream));
CHECK_TYPE(cuMemGetAddressRange, CUresult (*)(CUdeviceptr *, size_t *, CUdeviceptr));
CHECK_TYPE(cuStreamCreate, CUresult (*)(CUstream *, unsigned int));
CHECK_TYPE(cuStreamDestroy, CUresult (*)(CUstream));
CHECK_TYPE(cuStreamSynchronize, CUresult (*)(CUstream));
CHECK_TYPE(cuStreamWaitEvent, CUresult (*)(CUstream, CUevent, unsigned int));
CHECK_TYPE(cuEventCreate, CUresult (*)(CUevent *, unsigned int));
CHECK_TYPE(cuEventDestroy, CUresult (*)(CUevent));
CHECK_TYPE(cuEventRecord, CUresult (*)(CUevent, CUstream));
CHECK_TYPE(cuEventSynchronize, CUresult (*)(CUevent));
CHECK_TYPE(cuEventElapsedTime, CUresult (*)(float *, CUevent, CUevent));
CHECK_TYPE(cuDeviceCanAccessPeer, CUresult (*)(int *, CUdevice, CUdevice));
CHECK_TYPE(cuCtxEnablePeerAccess, CUresult (*)(CUcontext, unsigned int));
CHECK_TYPE(cuStreamBeginCapture, CUresult (*)(CUstream, CUstreamCaptureMode));
CHECK_TYPE(cuStreamEndCapture, CUresult (*)(CUstream, CUgraph *));
CHECK_TYPE(cuGraphInstantiateWithFlags, CUresult (*)(CUgraphExec *, CUgraph, unsigned long long));
CHECK_TYPE(cuGraphLaunch, CUresult (*)(CUgraphExec, CUstream));
CHECK_TYPE(cuGraphExecDestroy, CUresult (*)(CUgraphExec));
CHECK_TYPE(cuGraphDestroy, CUresult (*)(CUgraph));
CHECK_TYPE(cuModuleLoadData, CUresult (*)(CUmodule *, const void *));
CHECK_TYPE(cuModuleUnload, CUresult (*)(CUmodule));
CHECK_TYPE(cuModuleGetFunction, CUresult (*)(CUfunction *, CUmodule, const char *));
CHECK_TYPE(cuFuncSetAttribute, CUresult (*)(CUfunction, CUfunction_attribute, int));
CHECK_TYPE(cuFuncGetAttribute, CUresult (*)(int *, CUfunction_attribute, CUfunction));
CHECK_TYPE(cuCtxGetLimit, CUresult (*)(size_t *, CUlimit));
CHECK_TYPE(cuCtxSetLimit, CUresult (*)(CUlimit, size_t));
CHECK_TYPE(cuLaunchKernelEx, CUresult (*)(const CUlaunchConfig *, CUfunction, void **, void **));
CHECK_TYPE(cuLaunchKernel, CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, CUstream, void **, void **));
CHECK_TYPE(cuIpcGetMemHandle, CUresult (*)(CUipcMemHandle *, CUdeviceptr));
CHECK_TYPE(cuIpcOpenMemHandle, CUresult (*)(CUdeviceptr *, CUipcMemHandle, unsigned int));
CHECK_TYPE(cuIpcCloseMemHandle, CUresult (*)(CUdeviceptr));
CHECK_TYPE(cuStreamQuery, CUresult (*)(CUstream));
CHECK_TYPE(cuEventQuery, CUresult (*)(CUevent));
CHECK_TYPE(cuPointerGetAttribute, CUresult (*)(void *, CUpointer_attribute, CUdeviceptr));

// VMM (runtime/cuda/vmm.go; the shim casts these pointers with its own
// cg_CUmem* structs, asserted below to match cuda.h's layout).
CHECK_TYPE(cuMemGetAllocationGranularity, CUresult (*)(size_t *, const CUmemAllocationProp *,
                                                       CUmemAllocationGranularity_flags));
CHECK_TYPE(cuMemAddressReserve, CUresult (*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long));
CHECK_TYPE(cuMemAddressFree, CUresult (*)(CUdeviceptr, size_t));
CHECK_TYPE(cuMemCreate, CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                     unsigned long long));
CHECK_TYPE(cuMemRelease, CUresult (*)(CUmemGenericAllocationHandle));
CHECK_TYPE(cuMemMap, CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long));
CHECK_TYPE(cuMemUnmap, CUresult (*)(CUdeviceptr, size_t));
CHECK_TYPE(cuMemSetAccess, CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t));
CHECK_TYPE(cuMemExportToShareableHandle, CUresult (*)(void *, CUmemGenericAllocationHandle,
                                                      CUmemAllocationHandleType, unsigned long long));
CHECK_TYPE(cuMemImportFromShareableHandle, CUresult (*)(CUmemGenericAllocationHandle *, void *,
                                                        CUmemAllocationHandleType));
CHECK_TYPE(cuMemGetAllocationPropertiesFromHandle, CUresult (*)(CUmemAllocationProp *, CUmemGenericAllocationHandle));

CHECK_TYPE(nvrtcVersion, nvrtcResult (*)(int *, int *));
CHECK_TYPE(nvrtcGetErrorString, const char *(*)(nvrtcResult));
CHECK_TYPE(nvrtcCreateProgram, nvrtcResult (*)(nvrtcProgram *, const char *, const char *, int,
                                               const char *const *, const char *const *));
CHECK_TYPE(nvrtcDestroyProgram, nvrtcResult (*)(nvrtcProgram *));
CHECK_TYPE(nvrtcCompileProgram, nvrtcResult (*)(nvrtcProgram, int, const char *const *));
CHECK_TYPE(nvrtcGetProgramLogSize, nvrtcResult (*)(nvrtcProgram, size_t *));
CHECK_TYPE(nvrtcGetProgramLog, nvrtcResult (*)(nvrtcProgram, char *));
CHECK_TYPE(nvrtcGetCUBINSize, nvrtcResult (*)(nvrtcProgram, size_t *));
CHECK_TYPE(nvrtcGetCUBIN, nvrtcResult (*)(nvrtcProgram, char *));
CHECK_TYPE(nvrtcGetPTXSize, nvrtcResult (*)(nvrtcProgram, size_t *));
CHECK_TYPE(nvrtcGetPTX, nvrtcResult (*)(nvrtcProgram, char *));

CHECK_TYPE(ncclGetVersion, ncclResult_t (*)(int *));
CHECK_TYPE(ncclGetUniqueId, ncclResult_t (*)(ncclUniqueId *));
CHECK_TYPE(ncclCommInitRank, ncclResult_t (*)(ncclComm_t *, int, ncclUniqueId, int));
CHECK_TYPE(ncclCommDestroy, ncclResult_t (*)(ncclComm_t));
CHECK_TYPE(ncclCommAbort, ncclResult_t (*)(ncclComm_t));
CHECK_TYPE(ncclCommGetAsyncError, ncclResult_t (*)(ncclComm_t, ncclResult_t *));
CHECK_TYPE(ncclGetErrorString, const char *(*)(ncclResult_t));
CHECK_TYPE(ncclGetLastError, const char *(*)(ncclComm_t));
CHECK_TYPE(ncclAllReduce, ncclResult_t (*)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                           cudaStream_t));
CHECK_TYPE(ncclReduceScatter, ncclResult_t (*)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                               ncclComm_t, cudaStream_t));
CHECK_TYPE(ncclAllGather, ncclResult_t (*)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
CHECK_TYPE(ncclGroupStart, ncclResult_t (*)(void));
CHECK_TYPE(ncclGroupEnd, ncclResult_t (*)(void));
CHECK_TYPE(ncclCommInitRankConfig, ncclResult_t (*)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 19, 0)
CHECK_TYPE(ncclCommRegister, ncclResult_t (*)(const ncclComm_t, void *, size_t, void **));
CHECK_TYPE(ncclCommDeregister, ncclResult_t (*)(const ncclComm_t, void *));
CHECK_TYPE(ncclMemAlloc, ncclResult_t (*)(void **, size_t));
CHECK_TYPE(ncclMemFree, ncclResult_t (*)(void *));
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
CHECK_TYPE(ncclCommWindowRegister, ncclResult_t (*)(ncclComm_t, void *, size_t, ncclWindow_t *, int));
CHECK_TYPE(ncclCommWindowDeregister, ncclResult_t (*)(ncclComm_t, ncclWindow_t));
_Static_assert(NCCL_WIN_COLL_SYMMETRIC == 1, "NCCL_WIN_COLL_SYMMETRIC (nccl.WindowSymmetric)");
#endif
// runtime/nccl/nccl_shim.h's cgn_ncclConfig: the leading members of
// ncclConfig_t at the same offsets, and no larger than the real struct.
_Static_assert(__builtin_offsetof(ncclConfig_t, size) == 0 && __builtin_offsetof(ncclConfig_t, magic) == 8 &&
                   __builtin_offsetof(ncclConfig_t, version) == 12 && __builtin_offsetof(ncclConfig_t, blocking) == 16 &&
                   __builtin_offsetof(ncclConfig_t, cgaClusterSize) == 20 && __builtin_offsetof(ncclConfig_t, minCTAs) == 24 &&
                   __builtin_offsetof(ncclConfig_t, maxCTAs) == 28 && __builtin_offsetof(ncclConfig_t, netName) == 32 &&
                   __builtin_offsetof(ncclConfig_t, splitShare) == 40 && sizeof(ncclConfig_t) >= 48,
               "ncclConfig_t prefix (cgn_ncclConfig)");
_Static_assert(NCCL_CONFIG_UNDEF_INT == INT_MIN, "NCCL_CONFIG_UNDEF_INT (the magic 0xcafebeef is a literal in NCCL_CONFIG_INITIALIZER)");
_Static_assert(ncclInProgress == 7, "ncclInProgress");
_Static_assert(CUDA_ERROR_NOT_READY == 600, "CUDA_ERROR_NOT_READY (cuStreamQuery, cuEventQuery)");
_Static_assert(CU_POINTER_ATTRIBUTE_MEMORY_TYPE == 2 && CU_POINTER_ATTRIBUTE_IS_MANAGED == 8 &&
                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == 9 && CU_MEMORYTYPE_HOST == 1 && CU_MEMORYTYPE_DEVICE == 2,
               "pointer attributes (cuda.Device.Pointer)");

// Sizes and enum values the Go code hard-codes.
_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle");
// cuLaunchKernelEx's config and attribute, as cuda_shim.h declares them.
_Static_assert(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == 6, "PDL attribute id");
_Static_assert(sizeof(CUlaunchAttribute) == 72 && __builtin_offsetof(CUlaunchAttribute, value) == 8, "CUlaunchAttribute");
_Static_assert(__builtin_offsetof(CUlaunchConfig, hStream) == 32 && __builtin_offsetof(CUlaunchConfig, attrs) == 40 &&
                   __builtin_offsetof(CUlaunchConfig, numAttrs) == 48 && sizeof(CUlaunchConfig) == 56,
               "CUlaunchConfig");
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId");
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr");
_Static_assert(sizeof(CUresult) == 4 && sizeof(nvrtcResult) == 4 && sizeof(ncclResult_t) == 4, "enum sizes");
_Static_assert(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT == 16, "attr SM count");
_Static_assert(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY == 19, "attr map host");
_Static_assert(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING == 41, "attr UVA");
_Static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR == 75, "attr cc major");
_Static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR == 76, "attr cc minor");
_Static_assert(CU_MEMHOSTALLOC_PORTABLE == 1 && CU_MEMHOSTALLOC_DEVICEMAP == 2, "host alloc flags");
_Static_assert(CU_STREAM_NON_BLOCKING == 1, "stream flag");
_Static_assert(CU_STREAM_CAPTURE_MODE_RELAXED == 2, "capture mode");
_Static_assert(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == 8, "func attr");
_Static_assert(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES == 3 && CU_LIMIT_STACK_SIZE == 0, "local memory: func attr, ctx limit");
_Static_assert(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS == 1, "ipc flag");
_Static_assert(CUDA_ERROR_INVALID_VALUE == 1 && CUDA_ERROR_OUT_OF_MEMORY == 2 && CUDA_ERROR_NOT_INITIALIZED == 3, "err");
_Static_assert(CUDA_ERROR_NO_DEVICE == 100 && CUDA_ERROR_INVALID_DEVICE == 101, "err dev");
_Static_assert(CUDA_ERROR_INVALID_IMAGE == 200 && CUDA_ERROR_INVALID_CONTEXT == 201, "err img");
_Static_assert(CUDA_ERROR_NO_BINARY_FOR_GPU == 209 && CUDA_ERROR_PEER_ACCESS_UNSUPPORTED == 217, "err bin");
_Static_assert(CUDA_ERROR_INVALID_PTX == 218 && CUDA_ERROR_UNSUPPORTED_PTX_VERSION == 222, "err ptx");
_Static_assert(CUDA_ERROR_NOT_FOUND == 500 && CUDA_ERROR_NOT_READY == 600, "err nf");
_Static_assert(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED == 704, "err peer");
_Static_assert(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED == 900, "err capture");
_Static_assert(ncclInt8 == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclUint32 == 3 && ncclInt64 == 4 &&
                   ncclUint64 == 5 && ncclFloat16 == 6 && ncclFloat32 == 7 && ncclFloat64 == 8 && ncclBfloat16 == 9,
               "nccl dtypes");
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
_Static_assert(ncclFloat8e4m3 == 10 && ncclFloat8e5m2 == 11, "nccl fp8 dtypes");
#endif
_Static_assert(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4, "nccl ops");
_Static_assert(ncclSuccess == 0 && ncclInvalidUsage == 5 && ncclRemoteError == 6 && ncclInProgress == 7, "nccl res");

// VMM layouts and enum values (cuda_shim.h's cg_CUmem* structs mirror these).
_Static_assert(sizeof(CUmemGenericAllocationHandle) == 8, "VMM handle");
_Static_assert(sizeof(CUmemLocation) == 8 && __builtin_offsetof(CUmemLocation, id) == 4, "CUmemLocation");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp size");
_Static_assert(__builtin_offsetof(CUmemAllocationProp, requestedHandleTypes) == 4 &&
                   __builtin_offsetof(CUmemAllocationProp, location) == 8 &&
                   __builtin_offsetof(CUmemAllocationProp, win32HandleMetaData) == 16 &&
                   __builtin_offsetof(CUmemAllocationProp, allocFlags) == 24,
               "CUmemAllocationProp offsets");
_Static_assert(sizeof(CUmemAccessDesc) == 12 && __builtin_offsetof(CUmemAccessDesc, flags) == 8, "CUmemAccessDesc");
_Static_assert(CU_MEM_ALLOCATION_TYPE_PINNED == 1 && CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 1 &&
                   CU_MEM_LOCATION_TYPE_DEVICE == 1 && CU_MEM_ACCESS_FLAGS_PROT_READWRITE == 3,
               "VMM enums");
_Static_assert(CU_MEM_ALLOC_GRANULARITY_MINIMUM == 0 && CU_MEM_ALLOC_GRANULARITY_RECOMMENDED == 1, "granularity");
_Static_assert(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED == 102 &&
                   CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED == 103,
               "VMM attributes");

int main(void) {
  printf("CUDA_VERSION %d, NCCL_VERSION_CODE %d; prototypes, sizes and enums match the shims\n", CUDA_VERSION,
         NCCL_VERSION_CODE);
  SYM(cuDeviceTotalMem, "cuDeviceTotalMem_v2");
  SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  SYM(cuMemGetInfo, "cuMemGetInfo_v2");
  SYM(cuMemAlloc, "cuMemAlloc_v2");
  SYM(cuMemFree, "cuMemFree_v2");
  SYM(cuMemHostAlloc, "cuMemHostAlloc");
  SYM(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
  SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  SYM(cuMemcpyDtoD, "cuMemcpyDtoD_v2");
  SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  SYM(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
  SYM(cuMemsetD8, "cuMemsetD8_v2");
  SYM(cuMemsetD32, "cuMemsetD32_v2");
  SYM(cuMemsetD8Async, "cuMemsetD8Async");
  SYM(cuMemsetD32Async, "cuMemsetD32Async");
  SYM(cuMemGetAddressRange, "cuMemGetAddressRange_v2");
  SYM(cuStreamCreate, "cuStreamCreate");
  SYM(cuStreamDestroy, "cuStreamDestroy_v2");
  SYM(cuStreamSynchronize, "cuStreamSynchronize");
  SYM(cuStreamWaitEvent, "cuStreamWaitEvent");
  SYM(cuEventCreate, "cuEventCreate");
  SYM(cuEventDestroy, "cuEventDestroy_v2");
  SYM(cuEventRecord, "cuEventRecord");
  SYM(cuEventElapsedTime, "cuEventElapsedTime_v2");
  SYM(cuStreamBeginCapture, "cuStreamBeginCapture_v2");
  SYM(cuStreamEndCapture, "cuStreamEndCapture");
  SYM(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
  SYM(cuGraphLaunch, "cuGraphLaunch");
  SYM(cuModuleLoadData, "cuModuleLoadData");
  SYM(cuModuleGetFunction, "cuModuleGetFunction");
  SYM(cuLaunchKernel, "cuLaunchKernel");
  SYM(cuLaunchKernelEx, "cuLaunchKernelEx");
  SYM(cuIpcGetMemHandle, "cuIpcGetMemHandle");
  SYM(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2");
  SYM(cuIpcCloseMemHandle, "cuIpcCloseMemHandle");
  SYM(cuStreamQuery, "cuStreamQuery");
  SYM(cuEventQuery, "cuEventQuery");
  SYM(cuPointerGetAttribute, "cuPointerGetAttribute");
  SYM(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
  SYM(cuMemAddressReserve, "cuMemAddressReserve");
  SYM(cuMemAddressFree, "cuMemAddressFree");
  SYM(cuMemCreate, "cuMemCreate");
  SYM(cuMemRelease, "cuMemRelease");
  SYM(cuMemMap, "cuMemMap");
  SYM(cuMemUnmap, "cuMemUnmap");
  SYM(cuMemSetAccess, "cuMemSetAccess");
  SYM(cuMemExportToShareableHandle, "cuMemExportToShareableHandle");
  SYM(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle");
  SYM(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle");
  printf("%d symbol name(s) differ from the header's mapping\n", mismatches);
  return 0;
}
