// nccl_shim.h mirrors the parts of nccl.h collgen uses (NCCL 2.x ABI) and
// declares call-through wrappers over dlsym'd function pointers, so the
// package builds without NCCL installed.
#ifndef COLLGEN_NCCL_SHIM_H
#define COLLGEN_NCCL_SHIM_H

#include <stddef.h>

typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct ncclComm *ncclComm_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
// NCCL_UNIQUE_ID_BYTES = 128, passed by value to ncclCommInitRank.
typedef struct { char internal[128]; } ncclUniqueId;

#define CGN_MISSING_BASE 100000

// The leading members of ncclConfig_t, as NCCL 2.18 through 2.28 lay them
// out (nccl.h; tests/gpu/abi_check.c asserts the offsets against the real
// header). ncclCommInitRankConfig copies min(size, its own sizeof) bytes
// and fills the members past them from NCCL_CONFIG_INITIALIZER, so this
// prefix, with size = its own sizeof and version = 2.18.0, is a complete
// config for every library from 2.18 on.
typedef struct {
  size_t size;          // sizeof this struct
  unsigned int magic;   // NCCL_API_MAGIC
  unsigned int version; // NCCL_VERSION(2, 18, 0): the members present
  int blocking;         // 0: calls return ncclInProgress instead of waiting
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
} cgn_ncclConfig;
#define CGN_NCCL_API_MAGIC 0xcafebeefu
#define CGN_NCCL_CONFIG_VERSION 21800
#define CGN_NCCL_CONFIG_UNDEF_INT (-2147483647 - 1) // INT_MIN
#define CGN_NCCL_WIN_COLL_SYMMETRIC 0x01

#define CGN_SYMBOLS(X)                                                         \
  X(ncclGetVersion)                                                            \
  X(ncclGetUniqueId)                                                           \
  X(ncclCommInitRank)                                                          \
  X(ncclCommDestroy)                                                           \
  X(ncclCommAbort)                                                             \
  X(ncclCommGetAsyncError)                                                     \
  X(ncclGetErrorString)                                                        \
  X(ncclGetLastError)                                                          \
  X(ncclAllReduce)                                                             \
  X(ncclReduceScatter)                                                         \
  X(ncclAllGather)                                                             \
  X(ncclGroupStart)                                                            \
  X(ncclGroupEnd)                                                              \
  X(ncclCommInitRankConfig)                                                    \
  X(ncclCommRegister)                                                          \
  X(ncclCommDeregister)                                                        \
  X(ncclMemAlloc)                                                              \
  X(ncclMemFree)                                                               \
  X(ncclCommWindowRegister)                                                    \
  X(ncclCommWindowDeregister)

#define CGN_ENUM(s) CGN_##s,
enum { CGN_SYMBOLS(CGN_ENUM) CGN_COUNT };

const char *cgn_symbol(int i);
// cgn_resolve fills out[CGN_COUNT] from h; cgn_commit installs it.
void cgn_resolve(void *h, void **out);
void cgn_commit(void **tbl);

ncclResult_t cgn_ncclGetVersion(int *v);
ncclResult_t cgn_ncclGetUniqueId(void *id128);
ncclResult_t cgn_ncclCommInitRank(ncclComm_t *c, int nranks, const void *id128, int rank);
ncclResult_t cgn_ncclCommDestroy(ncclComm_t c);
ncclResult_t cgn_ncclCommAbort(ncclComm_t c);
ncclResult_t cgn_ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err);
const char *cgn_ncclGetErrorString(ncclResult_t r);
const char *cgn_ncclGetLastError(ncclComm_t c);
ncclResult_t cgn_ncclAllReduce(unsigned long long send, unsigned long long recv, size_t count,
                               ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c, unsigned long long s);
ncclResult_t cgn_ncclReduceScatter(unsigned long long send, unsigned long long recv, size_t recvcount,
                                   ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c, unsigned long long s);
ncclResult_t cgn_ncclAllGather(unsigned long long send, unsigned long long recv, size_t sendcount,
                               ncclDataType_t dt, ncclComm_t c, unsigned long long s);
ncclResult_t cgn_ncclGroupStart(void);
ncclResult_t cgn_ncclGroupEnd(void);
// cgn_ncclCommInitRankConfig initialises with a cgn_ncclConfig whose
// members are all NCCL's defaults but blocking.
ncclResult_t cgn_ncclCommInitRankConfig(ncclComm_t *c, int nranks, const void *id128, int rank, int blocking);
ncclResult_t cgn_ncclCommRegister(ncclComm_t c, unsigned long long buff, size_t size, unsigned long long *handle);
ncclResult_t cgn_ncclCommDeregister(ncclComm_t c, unsigned long long handle);
ncclResult_t cgn_ncclMemAlloc(unsigned long long *p, size_t size);
ncclResult_t cgn_ncclMemFree(unsigned long long p);
// cgn_ncclCommWindowRegister passes win on to NCCL, which may write it
// from its background thread after returning (non-blocking communicator):
// win must be C memory that outlives the operation.
ncclResult_t cgn_ncclCommWindowRegister(ncclComm_t c, unsigned long long buff, size_t size, ncclWindow_t *win, int flags);
ncclResult_t cgn_ncclCommWindowDeregister(ncclComm_t c, unsigned long long win);

#endif
