// nccl_shim.c: dlsym loader (the library is opened by runtime/internal/dl)
// and wrappers for libnccl. See nccl_shim.h.
#include "nccl_shim.h"

#include <dlfcn.h>
#include <string.h>

#define CGN_NAME(s) #s,
static const char *cgn_names[CGN_COUNT] = {CGN_SYMBOLS(CGN_NAME)};
// Installed once by cgn_commit (under a Go mutex) before any wrapper runs.
static void *cgn_fn[CGN_COUNT];

const char *cgn_symbol(int i) { return (i >= 0 && i < CGN_COUNT) ? cgn_names[i] : "?"; }
void cgn_resolve(void *h, void **out) {
  for (int i = 0; i < CGN_COUNT; i++) out[i] = dlsym(h, cgn_names[i]);
}
void cgn_commit(void **tbl) { memcpy(cgn_fn, tbl, sizeof cgn_fn); }

#define N_CALL(id, sig, ...)                                                   \
  do {                                                                         \
    void *f_ = cgn_fn[CGN_##id];                                               \
    if (!f_) return CGN_MISSING_BASE + CGN_##id;                               \
    return ((ncclResult_t(*) sig)f_)(__VA_ARGS__);                             \
  } while (0)

ncclResult_t cgn_ncclGetVersion(int *v) { N_CALL(ncclGetVersion, (int *), v); }
ncclResult_t cgn_ncclGetUniqueId(void *id128) {
  N_CALL(ncclGetUniqueId, (ncclUniqueId *), (ncclUniqueId *)id128);
}
ncclResult_t cgn_ncclCommInitRank(ncclComm_t *c, int nranks, const void *id128, int rank) {
  ncclUniqueId id;
  memcpy(&id, id128, sizeof id);
  N_CALL(ncclCommInitRank, (ncclComm_t *, int, ncclUniqueId, int), c, nranks, id, rank);
}
ncclResult_t cgn_ncclCommDestroy(ncclComm_t c) { N_CALL(ncclCommDestroy, (ncclComm_t), c); }
ncclResult_t cgn_ncclCommAbort(ncclComm_t c) { N_CALL(ncclCommAbort, (ncclComm_t), c); }
ncclResult_t cgn_ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
  N_CALL(ncclCommGetAsyncError, (ncclComm_t, ncclResult_t *), c, err);
}
const char *cgn_ncclGetErrorString(ncclResult_t r) {
  void *f = cgn_fn[CGN_ncclGetErrorString];
  return f ? ((const char *(*)(ncclResult_t))f)(r) : "unknown NCCL error";
}
const char *cgn_ncclGetLastError(ncclComm_t c) {
  void *f = cgn_fn[CGN_ncclGetLastError];
  return f ? ((const char *(*)(ncclComm_t))f)(c) : "";
}
ncclResult_t cgn_ncclAllReduce(unsigned long long send, unsigned long long recv, size_t count,
                               ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c, unsigned long long s) {
  N_CALL(ncclAllReduce,
         (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t),
         (const void *)(size_t)send, (void *)(size_t)recv, count, dt, op, c, (cudaStream_t)(size_t)s);
}
ncclResult_t cgn_ncclReduceScatter(unsigned long long send, unsigned long long recv, size_t recvcount,
                                   ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c, unsigned long long s) {
  N_CALL(ncclReduceScatter,
         (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t),
         (const void *)(size_t)send, (void *)(size_t)recv, recvcount, dt, op, c, (cudaStream_t)(size_t)s);
}
ncclResult_t cgn_ncclAllGather(unsigned long long send, unsigned long long recv, size_t sendcount,
                               ncclDataType_t dt, ncclComm_t c, unsigned long long s) {
  N_CALL(ncclAllGather, (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t),
         (const void *)(size_t)send, (void *)(size_t)recv, sendcount, dt, c, (cudaStream_t)(size_t)s);
}
ncclResult_t cgn_ncclGroupStart(void) { N_CALL(ncclGroupStart, (void)); }
ncclResult_t cgn_ncclGroupEnd(void) { N_CALL(ncclGroupEnd, (void)); }

_Static_assert(offsetof(cgn_ncclConfig, blocking) == 16 && offsetof(cgn_ncclConfig, netName) == 32 &&
                   offsetof(cgn_ncclConfig, splitShare) == 40 && sizeof(cgn_ncclConfig) == 48,
               "cgn_ncclConfig layout (tests/gpu/abi_check.c checks the same offsets in nccl.h)");

ncclResult_t cgn_ncclCommInitRankConfig(ncclComm_t *c, int nranks, const void *id128, int rank, int blocking) {
  ncclUniqueId id;
  memcpy(&id, id128, sizeof id);
  cgn_ncclConfig cfg = {sizeof(cgn_ncclConfig), CGN_NCCL_API_MAGIC, CGN_NCCL_CONFIG_VERSION, blocking,
                        CGN_NCCL_CONFIG_UNDEF_INT, CGN_NCCL_CONFIG_UNDEF_INT, CGN_NCCL_CONFIG_UNDEF_INT,
                        NULL, CGN_NCCL_CONFIG_UNDEF_INT};
  N_CALL(ncclCommInitRankConfig, (ncclComm_t *, int, ncclUniqueId, int, cgn_ncclConfig *), c, nranks, id, rank, &cfg);
}
ncclResult_t cgn_ncclCommRegister(ncclComm_t c, unsigned long long buff, size_t size, unsigned long long *handle) {
  void *f_ = cgn_fn[CGN_ncclCommRegister];
  if (!f_) return CGN_MISSING_BASE + CGN_ncclCommRegister;
  void *h = NULL;
  ncclResult_t r = ((ncclResult_t(*)(ncclComm_t, void *, size_t, void **))f_)(c, (void *)(size_t)buff, size, &h);
  *handle = (unsigned long long)(size_t)h;
  return r;
}
ncclResult_t cgn_ncclCommDeregister(ncclComm_t c, unsigned long long handle) {
  N_CALL(ncclCommDeregister, (ncclComm_t, void *), c, (void *)(size_t)handle);
}
ncclResult_t cgn_ncclMemAlloc(unsigned long long *p, size_t size) {
  void *f_ = cgn_fn[CGN_ncclMemAlloc];
  if (!f_) return CGN_MISSING_BASE + CGN_ncclMemAlloc;
  void *ptr = NULL;
  ncclResult_t r = ((ncclResult_t(*)(void **, size_t))f_)(&ptr, size);
  *p = (unsigned long long)(size_t)ptr;
  return r;
}
ncclResult_t cgn_ncclMemFree(unsigned long long p) { N_CALL(ncclMemFree, (void *), (void *)(size_t)p); }
ncclResult_t cgn_ncclCommWindowRegister(ncclComm_t c, unsigned long long buff, size_t size, ncclWindow_t *win, int flags) {
  N_CALL(ncclCommWindowRegister, (ncclComm_t, void *, size_t, ncclWindow_t *, int), c, (void *)(size_t)buff, size, win, flags);
}
ncclResult_t cgn_ncclCommWindowDeregister(ncclComm_t c, unsigned long long win) {
  N_CALL(ncclCommWindowDeregister, (ncclComm_t, ncclWindow_t), c, (ncclWindow_t)(size_t)win);
}
