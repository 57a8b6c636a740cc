// cuda_shim.h declares the few CUDA driver API and NVRTC types collgen uses,
// and the C wrappers (cuda_shim.c) that call through function pointers
// resolved with dlsym. No CUDA header is needed to build: everything here
// mirrors cuda.h / nvrtc.h of CUDA 11.4+ (checked against CUDA 13.0 by
// tests/gpu/abi_check.c on the GPU machine).
#ifndef COLLGEN_CUDA_SHIM_H
#define COLLGEN_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
// CUipcMemHandle is 64 opaque bytes (CU_IPC_HANDLE_SIZE), passed by value.
typedef struct { char reserved[64]; } CUipcMemHandle;

// cuLaunchKernelEx's launch configuration (CUDA 12.0+), as cuda.h lays it
// out: an attribute is its id, padding to 8 bytes, and a 64-byte union of
// values, of which collgen sets only the int of
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
#define CG_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6
typedef struct {
  int id;
  char pad[4];
  union {
    char pad[64];
    int programmaticStreamSerializationAllowed;
    unsigned long long align_; // the union holds pointers and size_t members
  } value;
} CUlaunchAttribute;
typedef struct {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute *attrs;
  unsigned numAttrs;
} CUlaunchConfig;

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

// A wrapper whose symbol was not found returns CG_MISSING_BASE + its index,
// which Go turns into an error naming the symbol. Real CUresult values are
// all below 1000.
#define CG_MISSING_BASE 100000

// X-macro list of driver symbols: X(index name, exported symbol). Where the
// preferred symbol is newer than some drivers, cuda_shim.c falls back to an
// older export with the same prototype (cuEventElapsedTime_v2, CUDA 12.8+,
// falls back to cuEventElapsedTime).
#define CG_CU_SYMBOLS(X)                                                       \
  X(cuInit, "cuInit")                                                          \
  X(cuDriverGetVersion, "cuDriverGetVersion")                                  \
  X(cuGetErrorName, "cuGetErrorName")                                          \
  X(cuDeviceGetCount, "cuDeviceGetCount")                                      \
  X(cuDeviceGet, "cuDeviceGet")                                                \
  X(cuDeviceGetName, "cuDeviceGetName")                                        \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute")                              \
  X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId")                                \
  X(cuDeviceGetByPCIBusId, "cuDeviceGetByPCIBusId")                            \
  X(cuDeviceTotalMem, "cuDeviceTotalMem_v2")                                   \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")                      \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2")                 \
  X(cuCtxSetCurrent, "cuCtxSetCurrent")                                        \
  X(cuCtxSynchronize, "cuCtxSynchronize")                                      \
  X(cuMemGetInfo, "cuMemGetInfo_v2")                                           \
  X(cuMemAlloc, "cuMemAlloc_v2")                                               \
  X(cuMemFree, "cuMemFree_v2")                                                 \
  X(cuMemHostAlloc, "cuMemHostAlloc")                                          \
  X(cuMemFreeHost, "cuMemFreeHost")                                            \
  X(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2")                 \
  X(cuMemcpyHtoD, "cuMemcpyHtoD_v2")                                           \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2")                                           \
  X(cuMemcpyDtoD, "cuMemcpyDtoD_v2")                                           \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")                                 \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")                                 \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2")                                 \
  X(cuMemsetD8, "cuMemsetD8_v2")                                               \
  X(cuMemsetD32, "cuMemsetD32_v2")                                             \
  X(cuMemsetD8Async, "cuMemsetD8Async")                                        \
  X(cuMemsetD32Async, "cuMemsetD32Async")                                      \
  X(cuMemGetAddressRange, "cuMemGetAddressRange_v2")                           \
  X(cuStreamCreate, "cuStreamCreate")                                          \
  X(cuStreamDestroy, "cuStreamDestroy_v2")                                     \
  X(cuStreamSynchronize, "cuStreamSynchronize")                                \
  X(cuStreamWaitEvent, "cuStreamWaitEvent")                                    \
  X(cuEventCreate, "cuEventCreate")                                            \
  X(cuEventDestroy, "cuEventDestroy_v2")                                       \
  X(cuEventRecord, "cuEventRecord")                                            \
  X(cuEventSynchronize, "cuEventSynchronize")                                  \
  X(cuEventElapsedTime, "cuEventElapsedTime_v2")                               \
  X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer")                            \
  X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess")                            \
  X(cuStreamBeginCapture, "cuStreamBeginCapture_v2")                           \
  X(cuStreamEndCapture, "cuStreamEndCapture")                                  \
  X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags")                \
  X(cuGraphLaunch, "cuGraphLaunch")                                            \
  X(cuGraphExecDestroy, "cuGraphExecDestroy")                                  \
  X(cuGraphDestroy, "cuGraphDestroy")                                          \
  X(cuModuleLoadData, "cuModuleLoadData")                                      \
  X(cuModuleUnload, "cuModuleUnload")                                          \
  X(cuModuleGetFunction, "cuModuleGetFunction")                                \
  X(cuFuncSetAttribute, "cuFuncSetAttribute")                                  \
  X(cuFuncGetAttribute, "cuFuncGetAttribute")                                  \
  X(cuCtxGetLimit, "cuCtxGetLimit")                                            \
  X(cuCtxSetLimit, "cuCtxSetLimit")                                            \
  X(cuLaunchKernel, "cuLaunchKernel")                                          \
  X(cuLaunchKernelEx, "cuLaunchKernelEx")                                      \
  X(cuIpcGetMemHandle, "cuIpcGetMemHandle")                                    \
  X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2")                               \
  X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle")                               \
  X(cuStreamQuery, "cuStreamQuery")                                            \
  X(cuEventQuery, "cuEventQuery")                                              \
  X(cuPointerGetAttribute, "cuPointerGetAttribute")

#define CG_ENUM(id, sym) CG_##id,
enum { CG_CU_SYMBOLS(CG_ENUM) CG_CU_COUNT };

#define CG_NVRTC_SYMBOLS(X)                                                    \
  X(nvrtcVersion, "nvrtcVersion")                                              \
  X(nvrtcGetErrorString, "nvrtcGetErrorString")                                \
  X(nvrtcCreateProgram, "nvrtcCreateProgram")                                  \
  X(nvrtcDestroyProgram, "nvrtcDestroyProgram")                                \
  X(nvrtcCompileProgram, "nvrtcCompileProgram")                                \
  X(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize")                          \
  X(nvrtcGetProgramLog, "nvrtcGetProgramLog")                                  \
  X(nvrtcGetCUBINSize, "nvrtcGetCUBINSize")                                    \
  X(nvrtcGetCUBIN, "nvrtcGetCUBIN")                                            \
  X(nvrtcGetPTXSize, "nvrtcGetPTXSize")                                        \
  X(nvrtcGetPTX, "nvrtcGetPTX")
enum { CG_NVRTC_SYMBOLS(CG_ENUM) CG_NVRTC_COUNT };

// Loader helpers. The library is opened by runtime/internal/dl;
// cg_*_resolve fills out[] (COUNT entries) from its handle with dlsym and
// does not touch the live tables; cg_*_commit installs a resolved table.
const char *cg_cu_symbol(int i);
const char *cg_nvrtc_symbol(int i);
void cg_cu_resolve(void *h, void **out);
void cg_cu_commit(void **tbl);
void cg_nvrtc_resolve(void *h, void **out);
void cg_nvrtc_commit(void **tbl);

// Driver wrappers (same arguments as the driver entry points).
CUresult cg_cuInit(unsigned flags);
CUresult cg_cuDriverGetVersion(int *v);
CUresult cg_cuGetErrorName(CUresult r, const char **name);
CUresult cg_cuDeviceGetCount(int *n);
CUresult cg_cuDeviceGet(CUdevice *d, int ordinal);
CUresult cg_cuDeviceGetName(char *name, int len, CUdevice d);
CUresult cg_cuDeviceGetAttribute(int *v, int attr, CUdevice d);
CUresult cg_cuDeviceGetPCIBusId(char *id, int len, CUdevice d);
CUresult cg_cuDeviceGetByPCIBusId(CUdevice *d, const char *id);
CUresult cg_cuDeviceTotalMem(size_t *b, CUdevice d);
CUresult cg_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d);
CUresult cg_cuDevicePrimaryCtxRelease(CUdevice d);
CUresult cg_cuCtxSetCurrent(CUcontext c);
CUresult cg_cuCtxSynchronize(void);
CUresult cg_cuMemGetInfo(size_t *free_b, size_t *total_b);
CUresult cg_cuMemAlloc(CUdeviceptr *p, size_t n);
CUresult cg_cuMemFree(CUdeviceptr p);
CUresult cg_cuMemHostAlloc(void **p, size_t n, unsigned flags);
CUresult cg_cuMemFreeHost(void *p);
CUresult cg_cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned flags);
CUresult cg_cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n);
CUresult cg_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n);
CUresult cg_cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cg_cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cg_cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cg_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cg_cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n);
CUresult cg_cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n);
CUresult cg_cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
CUresult cg_cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s);
CUresult cg_cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p);
CUresult cg_cuStreamCreate(CUstream *s, unsigned flags);
CUresult cg_cuStreamDestroy(CUstream s);
CUresult cg_cuStreamSynchronize(CUstream s);
CUresult cg_cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags);
CUresult cg_cuEventCreate(CUevent *e, unsigned flags);
CUresult cg_cuEventDestroy(CUevent e);
CUresult cg_cuEventRecord(CUevent e, CUstream s);
CUresult cg_cuEventSynchronize(CUevent e);
CUresult cg_cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cg_cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer);
CUresult cg_cuCtxEnablePeerAccess(CUcontext peer, unsigned flags);
CUresult cg_cuStreamBeginCapture(CUstream s, int mode);
CUresult cg_cuStreamEndCapture(CUstream s, CUgraph *g);
CUresult cg_cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags);
CUresult cg_cuGraphLaunch(CUgraphExec e, CUstream s);
CUresult cg_cuGraphExecDestroy(CUgraphExec e);
CUresult cg_cuGraphDestroy(CUgraph g);
CUresult cg_cuModuleLoadData(CUmodule *m, const void *image);
CUresult cg_cuModuleUnload(CUmodule m);
CUresult cg_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult cg_cuFuncSetAttribute(CUfunction f, int attr, int value);
CUresult cg_cuFuncGetAttribute(int *value, int attr, CUfunction f);
CUresult cg_cuCtxGetLimit(size_t *value, int limit);
CUresult cg_cuCtxSetLimit(int limit, size_t value);
CUresult cg_cuIpcGetMemHandle(void *handle64, CUdeviceptr p);
CUresult cg_cuIpcOpenMemHandle(CUdeviceptr *p, const void *handle64, unsigned flags);
CUresult cg_cuIpcCloseMemHandle(CUdeviceptr p);
CUresult cg_cuStreamQuery(CUstream s);
CUresult cg_cuEventQuery(CUevent e);
CUresult cg_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p);

// cg_launch launches f with one by-value kernel parameter whose bytes are
// args[0:argBytes] (argBytes 0 = no parameters). The bytes are copied into C
// memory first, so no Go pointer is kept in C memory. early != 0 launches
// through cuLaunchKernelEx with programmatic stream serialization allowed
// (see Function.LaunchEarly); the caller checks cg_has_launch_ex first.
CUresult cg_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                   unsigned bx, unsigned by, unsigned bz, unsigned shared,
                   CUstream s, const void *args, size_t argBytes, int early);
// cg_has_launch_ex reports whether the driver exports cuLaunchKernelEx.
int cg_has_launch_ex(void);

// NVRTC wrappers. Missing symbols return CG_MISSING_BASE + index.
nvrtcResult cg_nvrtcVersion(int *major, int *minor);
const char *cg_nvrtcGetErrorString(nvrtcResult r);
nvrtcResult cg_nvrtcCreateProgram(nvrtcProgram *p, const char *src, const char *name,
                                  int numHeaders, const char *const *headers,
                                  const char *const *includeNames);
nvrtcResult cg_nvrtcDestroyProgram(nvrtcProgram *p);
nvrtcResult cg_nvrtcCompileProgram(nvrtcProgram p, int numOptions, const char *const *options);
nvrtcResult cg_nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n);
nvrtcResult cg_nvrtcGetProgramLog(nvrtcProgram p, char *log);
nvrtcResult cg_nvrtcGetCUBINSize(nvrtcProgram p, size_t *n);
nvrtcResult cg_nvrtcGetCUBIN(nvrtcProgram p, char *out);
nvrtcResult cg_nvrtcGetPTXSize(nvrtcProgram p, size_t *n);
nvrtcResult cg_nvrtcGetPTX(nvrtcProgram p, char *out);

// ---- Virtual memory management (VMM), for runtime/symm's CUDA backend.
// A table of its own, resolved lazily by vmm.go from the same libcuda
// handle, so drivers without these entry points still load: a wrapper
// whose symbol is missing returns CG_VMM_MISSING_BASE + its index, which
// Go turns into an error naming the symbol.
#define CG_VMM_MISSING_BASE 200000

#define CG_VMM_SYMBOLS(X)                                                      \
  X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity")            \
  X(cuMemAddressReserve, "cuMemAddressReserve")                                \
  X(cuMemAddressFree, "cuMemAddressFree")                                      \
  X(cuMemCreate, "cuMemCreate")                                                \
  X(cuMemRelease, "cuMemRelease")                                              \
  X(cuMemMap, "cuMemMap")                                                      \
  X(cuMemUnmap, "cuMemUnmap")                                                  \
  X(cuMemSetAccess, "cuMemSetAccess")                                          \
  X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle")              \
  X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle")          \
  X(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle")
#define CG_VMM_ENUM(id, sym) CG_VMM_##id,
enum { CG_VMM_SYMBOLS(CG_VMM_ENUM) CG_VMM_COUNT };

typedef unsigned long long CUmemGenericAllocationHandle;

// The structs as cuda.h lays them out (CUDA 10.2+; tests/gpu/abi_check.c
// asserts sizes and offsets against the real header). Enums are ints.
typedef struct {
  int type; // CUmemLocationType: CU_MEM_LOCATION_TYPE_DEVICE = 1
  int id;   // the device ordinal
} cg_CUmemLocation; // 8 bytes
typedef struct {
  int type;                 // CUmemAllocationType: CU_MEM_ALLOCATION_TYPE_PINNED = 1
  int requestedHandleTypes; // CUmemAllocationHandleType: POSIX_FILE_DESCRIPTOR = 1
  cg_CUmemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} cg_CUmemAllocationProp; // 32 bytes
typedef struct {
  cg_CUmemLocation location;
  int flags; // CUmemAccess_flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
} cg_CUmemAccessDesc; // 12 bytes

const char *cg_vmm_symbol(int i);
void cg_vmm_resolve(void *h, void **out);
void cg_vmm_commit(void **tbl);

// Wrappers. dev is the device ordinal the memory lives on (cg_vmm_create,
// granularity) or that gets access (cg_vmm_set_access: n ordinals).
CUresult cg_vmm_granularity(size_t *g, int dev, int recommended);
CUresult cg_vmm_reserve(CUdeviceptr *p, size_t size, size_t align);
CUresult cg_vmm_free(CUdeviceptr p, size_t size);
CUresult cg_vmm_create(CUmemGenericAllocationHandle *h, size_t size, int dev);
CUresult cg_vmm_release(CUmemGenericAllocationHandle h);
CUresult cg_vmm_map(CUdeviceptr p, size_t size, CUmemGenericAllocationHandle h);
CUresult cg_vmm_unmap(CUdeviceptr p, size_t size);
CUresult cg_vmm_set_access(CUdeviceptr p, size_t size, const int *devs, int n);
CUresult cg_vmm_export_fd(int *fd, CUmemGenericAllocationHandle h);
CUresult cg_vmm_import_fd(CUmemGenericAllocationHandle *h, int fd);
// cg_vmm_location returns the location type and id of an allocation.
CUresult cg_vmm_location(CUmemGenericAllocationHandle h, int *type, int *id);

#endif
