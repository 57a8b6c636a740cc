// pdl_probe.cu: what programmatic dependent launch saves between
// back-to-back kernels on one GPU. A CUDA graph of 20 small kernels (each
// reads a counter, touches its block's data and advances the counter the
// way collgen's kernels do: an arrival atomic, the last block stores) is
// replayed 500 times, plain, launched early (griddepcontrol.wait first),
// and launched early with the early release of the next kernel
// (griddepcontrol.launch_dependents), for grids of 1, 8 and 128 blocks;
// it prints microseconds per kernel (docs/performance.md, "Small
// messages"). On the GPU machine:
//
//   nvcc -O3 -arch=sm_90 -o /tmp/pdl tests/gpu/pdl_probe.cu && /tmp/pdl
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
__global__ void __launch_bounds__(256) k_plain(unsigned long long* seq, float* buf, int n, int pdl, int trig) {
#if __CUDA_ARCH__ >= 900
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (trig) asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
  unsigned long long e = *(volatile unsigned long long*)seq;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] = buf[i] * 0.5f + (float)(e & 7);
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long d = atomicAdd(seq + 1, 1ull);
    if (d == gridDim.x - 1) { seq[1] = 0; seq[0] += 1; }
  }
}
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)
int run(int blocks, int pdl, int trig, unsigned long long* seq, float* buf) {
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int K = 20;
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < K; i++) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = blocks; cfg.blockDim = 256; cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at; cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, k_plain, seq, buf, blocks * 256, pdl, trig));
  }
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiateWithFlags(&ge, g, 0));
  for (int i = 0; i < 20; i++) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  const int R = 500;
  CK(cudaEventRecord(a, s));
  for (int i = 0; i < R; i++) CK(cudaGraphLaunch(ge, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms; cudaEventElapsedTime(&ms, a, b);
  printf("blocks %3d pdl %d trigger %d: %.3f us per kernel\n", blocks, pdl, trig, ms * 1000 / (R * K));
  return 0;
}
int main() {
  unsigned long long* seq; float* buf;
  cudaMalloc(&seq, 64); cudaMemset(seq, 0, 64); cudaMalloc(&buf, 1 << 22); cudaMemset(buf, 0, 1 << 22);
  for (int rep = 0; rep < 2; rep++)
  for (int blocks : {1, 8, 128}) { run(blocks, 0, 0, seq, buf); run(blocks, 1, 0, seq, buf); run(blocks, 1, 1, seq, buf); }
  unsigned long long h[2]; cudaMemcpy(h, seq, 16, cudaMemcpyDeviceToHost);
  printf("seq %llu (want %d)\n", h[0], 2 * 3 * 3 * (20 + 500) * 20);
  return 0;
}
