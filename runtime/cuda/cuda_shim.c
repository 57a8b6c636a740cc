//go:build cgo

// cuda_shim.c: dlsym loader (runtime/internal/dl opens the libraries) and
// call-through wrappers for the CUDA driver API and NVRTC. See cuda_shim.h.
#include "cuda_shim.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define CG_NAME(id, sym) sym,
static const char *cg_cu_names[CG_CU_COUNT] = {CG_CU_SYMBOLS(CG_NAME)};
static const char *cg_nvrtc_names[CG_NVRTC_COUNT] = {CG_NVRTC_SYMBOLS(CG_NAME)};

// Live tables. Written once by cg_*_commit (under a Go-side mutex, before any
// wrapper can be called) and read-only afterwards.
static void *cg_cu[CG_CU_COUNT];
static void *cg_nv[CG_NVRTC_COUNT];

const char *cg_cu_symbol(int i) {
  return (i >= 0 && i < CG_CU_COUNT) ? cg_cu_names[i] : "?";
}
const char *cg_nvrtc_symbol(int i) {
  return (i >= 0 && i < CG_NVRTC_COUNT) ? cg_nvrtc_names[i] : "?";
}
void cg_cu_resolve(void *h, void **out) {
  for (int i = 0; i < CG_CU_COUNT; i++) out[i] = dlsym(h, cg_cu_names[i]);
  // Older exports with the same prototype, for drivers before the newer one.
  if (!out[CG_cuEventElapsedTime]) out[CG_cuEventElapsedTime] = dlsym(h, "cuEventElapsedTime");
}
void cg_cu_commit(void **tbl) { memcpy(cg_cu, tbl, sizeof(cg_cu)); }
void cg_nvrtc_resolve(void *h, void **out) {
  for (int i = 0; i < CG_NVRTC_COUNT; i++) out[i] = dlsym(h, cg_nvrtc_names[i]);
}
void cg_nvrtc_commit(void **tbl) { memcpy(cg_nv, tbl, sizeof(cg_nv)); }

#define CU_CALL(id, sig, ...)                                                  \
  do {                                                                         \
    void *f_ = cg_cu[CG_##id];                                                 \
    if (!f_) return CG_MISSING_BASE + CG_##id;                                 \
    return ((CUresult(*) sig)f_)(__VA_ARGS__);                                 \
  } while (0)

#define NV_CALL(id, sig, ...)                                                  \
  do {                                                                         \
    void *f_ = cg_nv[CG_##id];                                                 \
    if (!f_) return CG_MISSING_BASE + CG_##id;                                 \
    return ((nvrtcResult(*) sig)f_)(__VA_ARGS__);                              \
  } while (0)

CUresult cg_cuInit(unsigned flags) { CU_CALL(cuInit, (unsigned), flags); }
CUresult cg_cuDriverGetVersion(int *v) { CU_CALL(cuDriverGetVersion, (int *), v); }
CUresult cg_cuGetErrorName(CUresult r, const char **name) {
  CU_CALL(cuGetErrorName, (CUresult, const char **), r, name);
}
CUresult cg_cuDeviceGetCount(int *n) { CU_CALL(cuDeviceGetCount, (int *), n); }
CUresult cg_cuDeviceGet(CUdevice *d, int ordinal) {
  CU_CALL(cuDeviceGet, (CUdevice *, int), d, ordinal);
}
CUresult cg_cuDeviceGetName(char *name, int len, CUdevice d) {
  CU_CALL(cuDeviceGetName, (char *, int, CUdevice), name, len, d);
}
CUresult cg_cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  CU_CALL(cuDeviceGetAttribute, (int *, int, CUdevice), v, attr, d);
}
CUresult cg_cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
  CU_CALL(cuDeviceGetPCIBusId, (char *, int, CUdevice), id, len, d);
}
CUresult cg_cuDeviceGetByPCIBusId(CUdevice *d, const char *id) {
  CU_CALL(cuDeviceGetByPCIBusId, (CUdevice *, const char *), d, id);
}
CUresult cg_cuDeviceTotalMem(size_t *b, CUdevice d) {
  CU_CALL(cuDeviceTotalMem, (size_t *, CUdevice), b, d);
}
CUresult cg_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  CU_CALL(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice), c, d);
}
CUresult cg_cuDevicePrimaryCtxRelease(CUdevice d) {
  CU_CALL(cuDevicePrimaryCtxRelease, (CUdevice), d);
}
CUresult cg_cuCtxSetCurrent(CUcontext c) { CU_CALL(cuCtxSetCurrent, (CUcontext), c); }
CUresult cg_cuCtxSynchronize(void) { CU_CALL(cuCtxSynchronize, (void)); }
CUresult cg_cuMemGetInfo(size_t *free_b, size_t *total_b) {
  CU_CALL(cuMemGetInfo, (size_t *, size_t *), free_b, total_b);
}
CUresult cg_cuMemAlloc(CUdeviceptr *p, size_t n) {
  CU_CALL(cuMemAlloc, (CUdeviceptr *, size_t), p, n);
}
CUresult cg_cuMemFree(CUdeviceptr p) { CU_CALL(cuMemFree, (CUdeviceptr), p); }
CUresult cg_cuMemHostAlloc(void **p, size_t n, unsigned flags) {
  CU_CALL(cuMemHostAlloc, (void **, size_t, unsigned), p, n, flags);
}
CUresult cg_cuMemFreeHost(void *p) { CU_CALL(cuMemFreeHost, (void *), p); }
CUresult cg_cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned flags) {
  CU_CALL(cuMemHostGetDevicePointer, (CUdeviceptr *, void *, unsigned), d, p, flags);
}
CUresult cg_cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
  CU_CALL(cuMemcpyHtoD, (CUdeviceptr, const void *, size_t), dst, src, n);
}
CUresult cg_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  CU_CALL(cuMemcpyDtoH, (void *, CUdeviceptr, size_t), dst, src, n);
}
CUresult cg_cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  CU_CALL(cuMemcpyDtoD, (CUdeviceptr, CUdeviceptr, size_t), dst, src, n);
}
CUresult cg_cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  CU_CALL(cuMemcpyHtoDAsync, (CUdeviceptr, const void *, size_t, CUstream), dst, src, n, s);
}
CUresult cg_cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  CU_CALL(cuMemcpyDtoHAsync, (void *, CUdeviceptr, size_t, CUstream), dst, src, n, s);
}
CUresult cg_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  CU_CALL(cuMemcpyDtoDAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream), dst, src, n, s);
}
CUresult cg_cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
  CU_CALL(cuMemsetD8, (CUdeviceptr, unsigned char, size_t), dst, v, n);
}
CUresult cg_cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n) {
  CU_CALL(cuMemsetD32, (CUdeviceptr, unsigned int, size_t), dst, v, n);
}
CUresult cg_cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  CU_CALL(cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream), dst, v, n, s);
}
CUresult cg_cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
  CU_CALL(cuMemsetD32Async, (CUdeviceptr, unsigned int, size_t, CUstream), dst, v, n, s);
}
CUresult cg_cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  CU_CALL(cuMemGetAddressRange, (CUdeviceptr *, size_t *, CUdeviceptr), base, size, p);
}
CUresult cg_cuStreamCreate(CUstream *s, unsigned flags) {
  CU_CALL(cuStreamCreate, (CUstream *, unsigned), s, flags);
}
CUresult cg_cuStreamDestroy(CUstream s) { CU_CALL(cuStreamDestroy, (CUstream), s); }
CUresult cg_cuStreamSynchronize(CUstream s) { CU_CALL(cuStreamSynchronize, (CUstream), s); }
CUresult cg_cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
  CU_CALL(cuStreamWaitEvent, (CUstream, CUevent, unsigned), s, e, flags);
}
CUresult cg_cuEventCreate(CUevent *e, unsigned flags) {
  CU_CALL(cuEventCreate, (CUevent *, unsigned), e, flags);
}
CUresult cg_cuEventDestroy(CUevent e) { CU_CALL(cuEventDestroy, (CUevent), e); }
CUresult cg_cuEventRecord(CUevent e, CUstream s) {
  CU_CALL(cuEventRecord, (CUevent, CUstream), e, s);
}
CUresult cg_cuEventSynchronize(CUevent e) { CU_CALL(cuEventSynchronize, (CUevent), e); }
CUresult cg_cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
  CU_CALL(cuEventElapsedTime, (float *, CUevent, CUevent), ms, start, end);
}
CUresult cg_cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
  CU_CALL(cuDeviceCanAccessPeer, (int *, CUdevice, CUdevice), can, d, peer);
}
CUresult cg_cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
  CU_CALL(cuCtxEnablePeerAccess, (CUcontext, unsigned), peer, flags);
}
CUresult cg_cuStreamBeginCapture(CUstream s, int mode) {
  CU_CALL(cuStreamBeginCapture, (CUstream, int), s, mode);
}
CUresult cg_cuStreamEndCapture(CUstream s, CUgraph *g) {
  CU_CALL(cuStreamEndCapture, (CUstream, CUgraph *), s, g);
}
CUresult cg_cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
  CU_CALL(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long), e, g, flags);
}
CUresult cg_cuGraphLaunch(CUgraphExec e, CUstream s) {
  CU_CALL(cuGraphLaunch, (CUgraphExec, CUstream), e, s);
}
CUresult cg_cuGraphExecDestroy(CUgraphExec e) { CU_CALL(cuGraphExecDestroy, (CUgraphExec), e); }
CUresult cg_cuGraphDestroy(CUgraph g) { CU_CALL(cuGraphDestroy, (CUgraph), g); }
CUresult cg_cuModuleLoadData(CUmodule *m, const void *image) {
  CU_CALL(cuModuleLoadData, (CUmodule *, const void *), m, image);
}
CUresult cg_cuModuleUnload(CUmodule m) { CU_CALL(cuModuleUnload, (CUmodule), m); }
CUresult cg_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  CU_CALL(cuModuleGetFunction, (CUfunction *, CUmodule, const char *), f, m, name);
}
CUresult cg_cuFuncSetAttribute(CUfunction f, int attr, int value) {
  CU_CALL(cuFuncSetAttribute, (CUfunction, int, int), f, attr, value);
}
CUresult cg_cuFuncGetAttribute(int *value, int attr, CUfunction f) {
  CU_CALL(cuFuncGetAttribute, (int *, int, CUfunction), value, attr, f);
}
CUresult cg_cuCtxGetLimit(size_t *value, int limit) {
  CU_CALL(cuCtxGetLimit, (size_t *, int), value, limit);
}
CUresult cg_cuCtxSetLimit(int limit, size_t value) {
  CU_CALL(cuCtxSetLimit, (int, size_t), limit, value);
}
CUresult cg_cuIpcGetMemHandle(void *handle64, CUdeviceptr p) {
  CU_CALL(cuIpcGetMemHandle, (CUipcMemHandle *, CUdeviceptr), (CUipcMemHandle *)handle64, p);
}
CUresult cg_cuIpcOpenMemHandle(CUdeviceptr *p, const void *handle64, unsigned flags) {
  CUipcMemHandle h;
  memcpy(&h, handle64, sizeof h);
  CU_CALL(cuIpcOpenMemHandle, (CUdeviceptr *, CUipcMemHandle, unsigned), p, h, flags);
}
CUresult cg_cuIpcCloseMemHandle(CUdeviceptr p) { CU_CALL(cuIpcCloseMemHandle, (CUdeviceptr), p); }
CUresult cg_cuStreamQuery(CUstream s) { CU_CALL(cuStreamQuery, (CUstream), s); }
CUresult cg_cuEventQuery(CUevent e) { CU_CALL(cuEventQuery, (CUevent), e); }
CUresult cg_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  CU_CALL(cuPointerGetAttribute, (void *, int, CUdeviceptr), data, attr, p);
}

CUresult cg_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                   unsigned bx, unsigned by, unsigned bz, unsigned shared,
                   CUstream s, const void *args, size_t argBytes, int early) {
  void *fn = cg_cu[early ? CG_cuLaunchKernelEx : CG_cuLaunchKernel];
  if (!fn) return CG_MISSING_BASE + (early ? CG_cuLaunchKernelEx : CG_cuLaunchKernel);
  // The driver copies parameter values during the launch (and during
  // stream capture, into the graph node), so a temporary copy suffices.
  _Alignas(16) unsigned char small[1024];
  void *copy = small;
  void *param[1];
  void **params = NULL;
  if (argBytes > 0) {
    if (argBytes > sizeof small) {
      copy = aligned_alloc(16, (argBytes + 15) & ~(size_t)15);
      if (!copy) return 2; // CUDA_ERROR_OUT_OF_MEMORY
    }
    memcpy(copy, args, argBytes);
    param[0] = copy;
    params = param;
  }
  CUresult r;
  if (early) {
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CG_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg = {gx, gy, gz, bx, by, bz, shared, s, &attr, 1};
    typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
    r = ((launch_ex_t)fn)(&cfg, f, params, NULL);
  } else {
    typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, unsigned, unsigned,
                                 CUstream, void **, void **);
    r = ((launch_t)fn)(f, gx, gy, gz, bx, by, bz, shared, s, params, NULL);
  }
  if (copy != small) free(copy);
  return r;
}

int cg_has_launch_ex(void) { return cg_cu[CG_cuLaunchKernelEx] != NULL; }

nvrtcResult cg_nvrtcVersion(int *major, int *minor) {
  NV_CALL(nvrtcVersion, (int *, int *), major, minor);
}
const char *cg_nvrtcGetErrorString(nvrtcResult r) {
  void *f = cg_nv[CG_nvrtcGetErrorString];
  if (!f) return "NVRTC_ERROR_UNKNOWN";
  return ((const char *(*)(nvrtcResult))f)(r);
}
nvrtcResult cg_nvrtcCreateProgram(nvrtcProgram *p, const char *src, const char *name,
                                  int numHeaders, const char *const *headers,
                                  const char *const *includeNames) {
  NV_CALL(nvrtcCreateProgram,
          (nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *),
          p, src, name, numHeaders, headers, includeNames);
}
nvrtcResult cg_nvrtcDestroyProgram(nvrtcProgram *p) {
  NV_CALL(nvrtcDestroyProgram, (nvrtcProgram *), p);
}
nvrtcResult cg_nvrtcCompileProgram(nvrtcProgram p, int numOptions, const char *const *options) {
  NV_CALL(nvrtcCompileProgram, (nvrtcProgram, int, const char *const *), p, numOptions, options);
}
nvrtcResult cg_nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n) {
  NV_CALL(nvrtcGetProgramLogSize, (nvrtcProgram, size_t *), p, n);
}
nvrtcResult cg_nvrtcGetProgramLog(nvrtcProgram p, char *log) {
  NV_CALL(nvrtcGetProgramLog, (nvrtcProgram, char *), p, log);
}
nvrtcResult cg_nvrtcGetCUBINSize(nvrtcProgram p, size_t *n) {
  NV_CALL(nvrtcGetCUBINSize, (nvrtcProgram, size_t *), p, n);
}
nvrtcResult cg_nvrtcGetCUBIN(nvrtcProgram p, char *out) {
  NV_CALL(nvrtcGetCUBIN, (nvrtcProgram, char *), p, out);
}
nvrtcResult cg_nvrtcGetPTXSize(nvrtcProgram p, size_t *n) {
  NV_CALL(nvrtcGetPTXSize, (nvrtcProgram, size_t *), p, n);
}
nvrtcResult cg_nvrtcGetPTX(nvrtcProgram p, char *out) {
  NV_CALL(nvrtcGetPTX, (nvrtcProgram, char *), p, out);
}

// ---- VMM (see cuda_shim.h).
#define CG_VMM_NAME(id, sym) sym,
static const char *cg_vmm_names[CG_VMM_COUNT] = {CG_VMM_SYMBOLS(CG_VMM_NAME)};
// Written once by cg_vmm_commit (under vmm.go's mutex, before any VMM
// wrapper runs) and read-only afterwards.
static void *cg_vmm[CG_VMM_COUNT];

const char *cg_vmm_symbol(int i) {
  return (i >= 0 && i < CG_VMM_COUNT) ? cg_vmm_names[i] : "?";
}
void cg_vmm_resolve(void *h, void **out) {
  for (int i = 0; i < CG_VMM_COUNT; i++) out[i] = dlsym(h, cg_vmm_names[i]);
}
void cg_vmm_commit(void **tbl) { memcpy(cg_vmm, tbl, sizeof(cg_vmm)); }

#define VMM_CALL(id, sig, ...)                                                 \
  do {                                                                         \
    void *f_ = cg_vmm[CG_VMM_##id];                                            \
    if (!f_) return CG_VMM_MISSING_BASE + CG_VMM_##id;                         \
    return ((CUresult(*) sig)f_)(__VA_ARGS__);                                 \
  } while (0)

// cg_vmm_prop fills the properties of collgen's allocations: pinned device
// memory on dev, shareable as a POSIX file descriptor.
static void cg_vmm_prop(cg_CUmemAllocationProp *prop, int dev) {
  memset(prop, 0, sizeof *prop);
  prop->type = 1;                 // CU_MEM_ALLOCATION_TYPE_PINNED
  prop->requestedHandleTypes = 1; // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
  prop->location.type = 1;        // CU_MEM_LOCATION_TYPE_DEVICE
  prop->location.id = dev;
}

CUresult cg_vmm_granularity(size_t *g, int dev, int recommended) {
  cg_CUmemAllocationProp prop;
  cg_vmm_prop(&prop, dev);
  VMM_CALL(cuMemGetAllocationGranularity, (size_t *, const cg_CUmemAllocationProp *, int), g, &prop,
           recommended ? 1 : 0); // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED : _MINIMUM
}
CUresult cg_vmm_reserve(CUdeviceptr *p, size_t size, size_t align) {
  VMM_CALL(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long), p, size,
           align, 0, 0);
}
CUresult cg_vmm_free(CUdeviceptr p, size_t size) {
  VMM_CALL(cuMemAddressFree, (CUdeviceptr, size_t), p, size);
}
CUresult cg_vmm_create(CUmemGenericAllocationHandle *h, size_t size, int dev) {
  cg_CUmemAllocationProp prop;
  cg_vmm_prop(&prop, dev);
  VMM_CALL(cuMemCreate,
           (CUmemGenericAllocationHandle *, size_t, const cg_CUmemAllocationProp *, unsigned long long), h,
           size, &prop, 0);
}
CUresult cg_vmm_release(CUmemGenericAllocationHandle h) {
  VMM_CALL(cuMemRelease, (CUmemGenericAllocationHandle), h);
}
CUresult cg_vmm_map(CUdeviceptr p, size_t size, CUmemGenericAllocationHandle h) {
  VMM_CALL(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long), p,
           size, 0, h, 0);
}
CUresult cg_vmm_unmap(CUdeviceptr p, size_t size) { VMM_CALL(cuMemUnmap, (CUdeviceptr, size_t), p, size); }
CUresult cg_vmm_set_access(CUdeviceptr p, size_t size, const int *devs, int n) {
  cg_CUmemAccessDesc desc[64];
  if (n <= 0 || n > 64) return 1; // CUDA_ERROR_INVALID_VALUE
  for (int i = 0; i < n; i++) {
    desc[i].location.type = 1; // CU_MEM_LOCATION_TYPE_DEVICE
    desc[i].location.id = devs[i];
    desc[i].flags = 3; // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
  }
  VMM_CALL(cuMemSetAccess, (CUdeviceptr, size_t, const cg_CUmemAccessDesc *, size_t), p, size, desc,
           (size_t)n);
}
CUresult cg_vmm_export_fd(int *fd, CUmemGenericAllocationHandle h) {
  VMM_CALL(cuMemExportToShareableHandle, (void *, CUmemGenericAllocationHandle, int, unsigned long long), fd,
           h, 1, 0); // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
}
CUresult cg_vmm_import_fd(CUmemGenericAllocationHandle *h, int fd) {
  // For POSIX descriptors the "OS handle" is the descriptor itself, cast.
  VMM_CALL(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *, void *, int), h,
           (void *)(uintptr_t)fd, 1);
}
CUresult cg_vmm_location(CUmemGenericAllocationHandle h, int *type, int *id) {
  cg_CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  void *f = cg_vmm[CG_VMM_cuMemGetAllocationPropertiesFromHandle];
  if (!f) return CG_VMM_MISSING_BASE + CG_VMM_cuMemGetAllocationPropertiesFromHandle;
  CUresult r = ((CUresult(*)(cg_CUmemAllocationProp *, CUmemGenericAllocationHandle))f)(&prop, h);
  *type = prop.location.type;
  *id = prop.location.id;
  return r;
}

// The mirrors of cuda.h's structs must keep its layout (abi_check.c asserts
// the real header's side).
_Static_assert(sizeof(cg_CUmemLocation) == 8, "cg_CUmemLocation");
_Static_assert(sizeof(cg_CUmemAllocationProp) == 32, "cg_CUmemAllocationProp");
_Static_assert(__builtin_offsetof(cg_CUmemAllocationProp, location) == 8 &&
                   __builtin_offsetof(cg_CUmemAllocationProp, win32HandleMetaData) == 16 &&
                   __builtin_offsetof(cg_CUmemAllocationProp, allocFlags) == 24,
               "cg_CUmemAllocationProp offsets");
_Static_assert(sizeof(cg_CUmemAccessDesc) == 12 && __builtin_offsetof(cg_CUmemAccessDesc, flags) == 8,
               "cg_CUmemAccessDesc");

// The launch configuration must match cuda.h's (tests/gpu/abi_check.c checks
// the real header on the GPU machine).
_Static_assert(sizeof(CUlaunchAttribute) == 72 && offsetof(CUlaunchAttribute, value) == 8, "CUlaunchAttribute layout");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32 && offsetof(CUlaunchConfig, attrs) == 40 &&
                   offsetof(CUlaunchConfig, numAttrs) == 48 && sizeof(CUlaunchConfig) == 56,
               "CUlaunchConfig layout");
