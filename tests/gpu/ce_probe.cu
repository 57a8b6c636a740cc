// Copy-engine and TMA probe (tests/gpu/ce_probe.cu): the shapes a copy-engine all-gather and
// reduce-scatter would take at world 2, and TMA bulk copies over NVLink, each captured in a CUDA graph
// on both GPUs at once (a host thread each) and replayed, best of 8. Sizes are per rank's block (an
// all-gather of 256 MiB pulls one 128 MiB block). Results and what they decided: docs/performance.md,
// "Copy engines and TMA". On a 2-GPU machine (CUDA 12 or later):
//   nvcc -O3 -arch=sm_90 -o ce_probe tests/gpu/ce_probe.cu -lcuda && ./ce_probe
#include <cstdio>
#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <thread>
#include <chrono>
#include <unistd.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

__global__ void copyk(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}
__global__ void addk(float4* __restrict__ dst, const float4* __restrict__ a, const float4* __restrict__ b, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float4 x = a[i], y = b[i];
    dst[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

#if __CUDA_ARCH__ >= 900 || !defined(__CUDA_ARCH__)
// TMA bulk copy of bytes from src to dst through shared memory: one thread per block issues S-stage loads
// (cp.async.bulk global -> shared, completing on an mbarrier) and bulk stores (shared -> global) of chunk bytes.
template <int S>
__global__ void __launch_bounds__(32) tmak(char* dst, const char* src, size_t bytes, unsigned chunk) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  for (int b = 0; b < S; b++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((unsigned)__cvta_generic_to_shared(&bar[b])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  size_t nchunks = bytes / chunk;
  size_t mine = nchunks > blockIdx.x ? (nchunks - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  auto at = [&](size_t j) { return (blockIdx.x + j * gridDim.x) * (size_t)chunk; };
  auto load = [&](size_t j) {
    int b = j % S;
    unsigned mb = (unsigned)__cvta_generic_to_shared(&bar[b]);
    unsigned sm = (unsigned)__cvta_generic_to_shared(smem + (size_t)b * chunk);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb), "r"(chunk) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sm), "l"(src + at(j)), "r"(chunk), "r"(mb) : "memory");
  };
  for (size_t j = 0; j < mine && j < S; j++) load(j);
  for (size_t j = 0; j < mine; j++) {
    int b = j % S;
    unsigned mb = (unsigned)__cvta_generic_to_shared(&bar[b]);
    unsigned par = (j / S) & 1, done = 0;
    while (!done) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(mb), "r"(par) : "memory");
    unsigned sm = (unsigned)__cvta_generic_to_shared(smem + (size_t)b * chunk);
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + at(j)), "r"(sm), "r"(chunk) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (j >= 1 && j - 1 + S < mine) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      load(j - 1 + S);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}
#endif
// A two-rank barrier: one thread bumps this rank's epoch, publishes it in the peer's flag and waits for the
// peer's. Stream order puts it after earlier work and before later work.
__device__ unsigned timedOut;  // set by a barrier that waited over a second (the probe reports it and stops)
__global__ void barrierk(unsigned* epoch, unsigned* peerFlag, unsigned* myFlag) {
  unsigned e = *epoch + 1;
  *epoch = e;
  __threadfence_system();
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(peerFlag), "r"(e) : "memory");
  unsigned v;
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(myFlag) : "memory");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > 1000000000ull) { timedOut = e | (v << 16); return; }
  } while (v < e);
}

const size_t MiB = 1 << 20;
const size_t BLOCK = 128 * MiB;   // one rank's block
char *in[2], *out[2], *tmp[2];      // in: this rank's input (2 blocks for reduce-scatter); out: 2 blocks; tmp: 2 x 32 MiB
unsigned *flag[2], *epoch[2];
cudaStream_t s[2], side[2];
cudaEvent_t forkEv[2][32], joinEv[2][32];

// Each experiment enqueues one replay's work for device d on s[d] (and side[d], forked and joined with events).
typedef void (*Enq)(int d, int param);

void barrier(int d) { barrierk<<<1, 1, 0, s[d]>>>(epoch[d], flag[1 - d], flag[d]); }
void forkSide(int d, int i) { CK(cudaEventRecord(forkEv[d][i], s[d])); CK(cudaStreamWaitEvent(side[d], forkEv[d][i], 0)); }
void joinSide(int d, int i) { CK(cudaEventRecord(joinEv[d][i], side[d])); CK(cudaStreamWaitEvent(s[d], joinEv[d][i], 0)); }

// CE pull of one block from the peer, in param memcpys.
void cePull(int d, int param) {
  size_t part = BLOCK / param;
  for (int i = 0; i < param; i++) CK(cudaMemcpyAsync(out[d] + i * part, in[1 - d] + i * part, part, cudaMemcpyDeviceToDevice, s[d]));
}
// CE pull on s, and on the side stream a local copy of the own block: param 0 by the copy engine, 1 by an SM kernel.
void cePullLocal(int d, int param) {
  forkSide(d, 0);
  if (param == 0) CK(cudaMemcpyAsync(out[d] + BLOCK, in[d], BLOCK, cudaMemcpyDeviceToDevice, side[d]));
  else copyk<<<132, 1024, 0, side[d]>>>((uint4*)(out[d] + BLOCK), (const uint4*)in[d], BLOCK / 16);
  CK(cudaMemcpyAsync(out[d], in[1 - d], BLOCK, cudaMemcpyDeviceToDevice, s[d]));
  joinSide(d, 0);
}
// The whole all-gather: barrier, CE pull beside an SM local copy, barrier.
void allgather(int d, int param) {
  barrier(d);
  cePullLocal(d, param);
  barrier(d);
}
// CE pull of (8-param)/8 of the block beside an SM pull of param/8 on the side stream.
void ceAndSM(int d, int param) {
  size_t sm = BLOCK / 8 * param, ce = BLOCK - sm;
  forkSide(d, 0);
  copyk<<<132, 1024, 0, side[d]>>>((uint4*)(out[d] + ce), (const uint4*)(in[1 - d] + ce), sm / 16);
  CK(cudaMemcpyAsync(out[d], in[1 - d], ce, cudaMemcpyDeviceToDevice, s[d]));
  joinSide(d, 0);
}
// Reduce-scatter of 2 blocks: rank d pulls the peer's block d in param chunks into two tmp slots (CE, on s), and the side
// stream adds each chunk to its own block d into out. Slot reuse waits for the add two chunks back.
void reduceScatter(int d, int param) {
  size_t part = BLOCK / param;
  const char* peerBlock = in[1 - d] + d * BLOCK;
  const char* ownBlock = in[d] + d * BLOCK;
  barrier(d);
  for (int i = 0; i < param; i++) {
    char* slot = tmp[d] + (i % 2) * 32 * MiB;
    if (i >= 2) CK(cudaStreamWaitEvent(s[d], joinEv[d][i - 2], 0));
    CK(cudaMemcpyAsync(slot, peerBlock + i * part, part, cudaMemcpyDeviceToDevice, s[d]));
    CK(cudaEventRecord(forkEv[d][i], s[d]));
    CK(cudaStreamWaitEvent(side[d], forkEv[d][i], 0));
    addk<<<264, 1024, 0, side[d]>>>((float4*)(out[d] + i * part), (const float4*)(ownBlock + i * part), (const float4*)slot, part / 16);
    CK(cudaEventRecord(joinEv[d][i], side[d]));
  }
  CK(cudaStreamWaitEvent(s[d], joinEv[d][param - 1], 0));
  barrier(d);
}
// TMA pull (param&1 == 0) or push (1) of one block; param>>1 selects the shape.
void tma(int d, int param) {
  const char* src = (param & 1) ? in[d] : in[1 - d];
  char* dst = (param & 1) ? (out[1 - d] + BLOCK) : out[d];
  switch (param >> 1) {
  case 0: tmak<4><<<132, 32, 4 * 32768, s[d]>>>(dst, src, BLOCK, 32768); break;
  case 1: tmak<6><<<132, 32, 6 * 32768, s[d]>>>(dst, src, BLOCK, 32768); break;
  case 2: tmak<4><<<264, 32, 4 * 16384, s[d]>>>(dst, src, BLOCK, 16384); break;
  case 3: tmak<8><<<132, 32, 8 * 16384, s[d]>>>(dst, src, BLOCK, 16384); break;
  case 4: tmak<4><<<396, 32, 4 * 8192, s[d]>>>(dst, src, BLOCK, 8192); break;
  }
}
// SM pull or push of one block (param 0 pull, 1 push), for the same call's reference.
void smCopy(int d, int param) {
  if (param == 0) copyk<<<528, 1024, 0, s[d]>>>((uint4*)out[d], (const uint4*)in[1 - d], BLOCK / 16);
  else copyk<<<528, 1024, 0, s[d]>>>((uint4*)(out[1 - d] + BLOCK), (const uint4*)in[d], BLOCK / 16);
}
// Ten all-gathers in one graph (the per-replay host skew amortised).
void allgather10(int d, int param) { for (int i = 0; i < 10; i++) allgather(d, param); }
void cePull10(int d, int param) { for (int i = 0; i < 10; i++) cePull(d, param); }
void tma10(int d, int param) { for (int i = 0; i < 10; i++) tma(d, param); }
void smCopy10(int d, int param) { for (int i = 0; i < 10; i++) smCopy(d, param); }

// Copy-engine synchronisation without kernels (stream memory operations): each rank copies a word holding 1 into
// its slot of every peer's slot array, waits for its own slots to read 1 and resets them. Two arrays (ready, done)
// used alternately keep consecutive syncs apart.
unsigned *slots[2], *one[2];  // per device: ready[2], done[2]; one word holding 1
void memopSync(int d, int which) {
  unsigned* mine = slots[d] + 2 * which;
  unsigned* peers = slots[1 - d] + 2 * which;
  CK(cudaMemcpyAsync(peers + d, one[d], 4, cudaMemcpyDeviceToDevice, s[d]));
  if (cuStreamWaitValue32(s[d], (CUdeviceptr)(mine + 1 - d), 1, CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS) { printf("wait failed\n"); exit(1); }
  if (cuStreamWriteValue32(s[d], (CUdeviceptr)(mine + 1 - d), 0, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) { printf("write failed\n"); exit(1); }
}
// The all-gather with memop syncs: param 0 local copy by the CE, 1 by an SM kernel; 2: no local copy.
void allgatherMemop(int d, int param) {
  memopSync(d, 0);
  if (param < 2) {
    forkSide(d, 0);
    if (param == 0) CK(cudaMemcpyAsync(out[d] + BLOCK, in[d], BLOCK, cudaMemcpyDeviceToDevice, side[d]));
    else copyk<<<132, 1024, 0, side[d]>>>((uint4*)(out[d] + BLOCK), (const uint4*)in[d], BLOCK / 16);
  }
  CK(cudaMemcpyAsync(out[d], in[1 - d], BLOCK, cudaMemcpyDeviceToDevice, s[d]));
  memopSync(d, 1);
  if (param < 2) joinSide(d, 0);
}
void allgatherMemop10(int d, int param) { for (int i = 0; i < 10; i++) allgatherMemop(d, param); }
void memopSyncs(int d, int param) { for (int i = 0; i < param; i++) memopSync(d, i & 1); }

// Barriers alone, param of them.
void barriers(int d, int param) { for (int i = 0; i < param; i++) barrier(d); }

void run(const char* name, Enq f, int param, size_t bytes) {
  cudaGraphExec_t ge[2];
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s[d], cudaStreamCaptureModeThreadLocal));
    f(d, param);
    CK(cudaStreamEndCapture(s[d], &g));
    CK(cudaGraphInstantiateWithFlags(&ge[d], g, 0));
    CK(cudaGraphDestroy(g));
  }
  cudaEvent_t e0[2], e1[2];
  for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaEventCreate(&e0[d])); CK(cudaEventCreate(&e1[d])); }
  // One host thread per GPU (a graph launch may block its thread until the GPU drains work; one thread driving both
  // GPUs could then hold back the peer a barrier waits for).
  float ms[2][9];
  std::atomic<int> arrived{0};
  auto drive = [&](int d) {
    CK(cudaSetDevice(d));
    for (int it = 0; it < 9; it++) {
      int want = 2 * (it + 1);
      arrived++;
      while (arrived.load() < want) {}
      CK(cudaEventRecord(e0[d], s[d])); CK(cudaGraphLaunch(ge[d], s[d])); CK(cudaEventRecord(e1[d], s[d]));
      // A watchdog: a replay that has not finished in two seconds is reported as a hang and ends the probe.
      auto t0 = std::chrono::steady_clock::now();
      while (cudaEventQuery(e1[d]) == cudaErrorNotReady) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(2)) { printf("%s param %d: GPU %d replay %d hung\n", name, param, d, it); fflush(stdout); _exit(3); }
      }
      CK(cudaEventElapsedTime(&ms[d][it], e0[d], e1[d]));
    }
  };
  std::thread t0(drive, 0), t1(drive, 1);
  t0.join(); t1.join();
  float best = 1e30f;
  for (int it = 1; it < 9; it++) { float worst = ms[0][it] > ms[1][it] ? ms[0][it] : ms[1][it]; if (worst < best) best = worst; }
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d)); unsigned t; CK(cudaMemcpyFromSymbol(&t, timedOut, 4));
    if (t) { printf("%s param %d: GPU %d barrier timed out (epoch %u, flag %u)\n", name, param, d, t & 0xffff, t >> 16); exit(1); }
  }
  printf("%-44s param %3d: %8.1f us", name, param, best * 1e3);
  if (bytes) printf(", %.1f GB/s per direction", bytes / (best * 1e-3) / 1e9);
  printf("\n");
  fflush(stdout);
  for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaGraphExecDestroy(ge[d])); CK(cudaEventDestroy(e0[d])); CK(cudaEventDestroy(e1[d])); }
}

int main() {
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d)); CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&in[d], 2 * BLOCK)); CK(cudaMalloc(&out[d], 2 * BLOCK)); CK(cudaMalloc(&tmp[d], 64 * MiB));
    CK(cudaMemset(in[d], 0, 2 * BLOCK)); CK(cudaMemset(out[d], 0, 2 * BLOCK));
    CK(cudaMalloc(&flag[d], 4)); CK(cudaMalloc(&slots[d], 16)); CK(cudaMemset(slots[d], 0, 16)); CK(cudaMalloc(&one[d], 4)); { unsigned o = 1; CK(cudaMemcpy(one[d], &o, 4, cudaMemcpyHostToDevice)); } CK(cudaMalloc(&epoch[d], 4)); CK(cudaMemset(flag[d], 0, 4)); CK(cudaMemset(epoch[d], 0, 4));
    CK(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&side[d], cudaStreamNonBlocking));
    for (int i = 0; i < 32; i++) { CK(cudaEventCreateWithFlags(&forkEv[d][i], cudaEventDisableTiming)); CK(cudaEventCreateWithFlags(&joinEv[d][i], cudaEventDisableTiming)); }
  }
  for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); }
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    CK(cudaFuncSetAttribute(tmak<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * 32768));
    CK(cudaFuncSetAttribute(tmak<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * 32768));
    CK(cudaFuncSetAttribute(tmak<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * 32768));
  }
  // What each way of moving a 128 MiB block between the GPUs reaches, ten times in one graph.
  run("kernel barriers x10", barriers, 10, 0);
  run("memop syncs x10", memopSyncs, 10, 0);
  run("CE pull x10", cePull10, 1, 10 * BLOCK);
  run("SM copy x10 (0 pull, 1 push)", smCopy10, 0, 10 * BLOCK);
  run("SM copy x10 (0 pull, 1 push)", smCopy10, 1, 10 * BLOCK);
  for (int p = 0; p < 4; p++) run("TMA x10 (param&1: push; >>1 shape)", tma10, p, 10 * BLOCK);
  // One graph replay each (host skew included).
  for (int p : {1, 4, 16}) run("CE pull one block in param memcpys", cePull, p, BLOCK);
  for (int p : {1, 2}) run("CE (8-param)/8 + SM pull param/8", ceAndSM, p, BLOCK);
  for (int p : {4, 16}) run("reduce-scatter: CE pull chunks, SM add beside", reduceScatter, p, BLOCK);
  // The all-gather shapes, ten in one graph; those that mix a second stream with cross-GPU waits have hung
  // (2026-11-23): the watchdog reports the first hang and ends the probe, so they come last.
  run("all-gather x10, memop syncs (0 CE, 1 SM, 2 no local)", allgatherMemop10, 2, 10 * BLOCK);
  run("all-gather x10, kernel barriers (0 CE, 1 SM local)", allgather10, 1, 10 * BLOCK);
  run("all-gather x10, memop syncs (0 CE, 1 SM, 2 no local)", allgatherMemop10, 1, 10 * BLOCK);
  return 0;
}
