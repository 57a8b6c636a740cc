// NVLink bandwidth probe (tests/gpu/nvlink_probe.cu): remote reads vs remote writes vs the copy engine (push and pull),
// both GPUs at once. On a 2-GPU machine: nvcc -O3 -arch=sm_90 -o probe tests/gpu/nvlink_probe.cu && ./probe
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)
__global__ void copyk(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}
__global__ void copyk4(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n) {
  // 4 loads in flight per thread
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a; dst[i + stride] = b; dst[i + 2 * stride] = c; dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}
int main() {
  const size_t bytes = 256ull << 20, n = bytes / 16;
  void *loc[2], *rem[2];
  cudaStream_t s[2]; cudaEvent_t e0[2], e1[2];
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d)); CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&loc[d], bytes)); CK(cudaMalloc(&rem[d], bytes));
    CK(cudaMemset(loc[d], 1, bytes)); CK(cudaMemset(rem[d], 2, bytes));
    CK(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking)); CK(cudaEventCreate(&e0[d])); CK(cudaEventCreate(&e1[d]));
  }
  for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); }
  int blocksList[] = {132, 264, 528, 1056};
  int threadsList[] = {512, 1024};
  for (int mode = 0; mode < 6; mode++) {
    for (int bi = 0; bi < 4; bi++) for (int ti = 0; ti < 2; ti++) {
      if (mode >= 4 && (bi > 0 || ti > 0)) continue;
      float best = 1e30f;
      for (int it = 0; it < 5; it++) {
        for (int d = 0; d < 2; d++) {
          CK(cudaSetDevice(d)); CK(cudaEventRecord(e0[d], s[d]));
          const uint4* src; uint4* dst;
          if (mode == 0 || mode == 2) { src = (const uint4*)rem[1 - d]; dst = (uint4*)loc[d]; }   // read remote
          else { src = (const uint4*)loc[d]; dst = (uint4*)rem[1 - d]; }                            // write remote
          if (mode == 4) CK(cudaMemcpyPeerAsync(rem[1 - d], 1 - d, loc[d], d, bytes, s[d]));       // push: this GPU's engine writes the peer
          else if (mode == 5) CK(cudaMemcpyPeerAsync(loc[d], d, rem[1 - d], 1 - d, bytes, s[d]));  // pull: it reads the peer
          else if (mode < 2) copyk<<<blocksList[bi], threadsList[ti], 0, s[d]>>>(dst, src, n);
          else copyk4<<<blocksList[bi], threadsList[ti], 0, s[d]>>>(dst, src, n);
          CK(cudaEventRecord(e1[d], s[d]));
        }
        float worst = 0;
        for (int d = 0; d < 2; d++) { CK(cudaSetDevice(d)); CK(cudaEventSynchronize(e1[d])); float ms; CK(cudaEventElapsedTime(&ms, e0[d], e1[d])); if (ms > worst) worst = ms; }
        if (worst < best) best = worst;
      }
      const char* names[] = {"read 1x", "write 1x", "read 4x", "write 4x", "CE push", "CE pull"};
      printf("%-12s blocks %4d threads %4d: %.1f us, %.1f GB/s per direction\n", names[mode], blocksList[bi], threadsList[ti], best * 1e3, bytes / (best * 1e-3) / 1e9);
    }
  }
  return 0;
}
