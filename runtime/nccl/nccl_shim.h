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
// NCCL_UNIQUE_ID_BYTES = 128, passed by value to ncclCommInitRank.
typedef struct { char internal[128]; } ncclUniqueId;

#define CGN_MISSING_BASE 100000

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
  X(ncclGroupEnd)

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

#endif
