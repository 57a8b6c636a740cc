// ll128_offset_probe.cu: what the LL128 protocol's unaligned paths cost on
// one GPU, with the header's own cg_ll128::ld and ::st (issue 22: the LL128
// one-shots pay 0.5-1.0 us below 1 MiB with pointers one element off, cause
// not found). Every thread of 68 blocks x 512 copies LL128 units of a bf16
// span through registers, src -> dst, the span and both pointers aligned or
// one element (2 bytes) off, for many steps; prints us per step. Build from
// the repository root: nvcc -O3 -arch=sm_90 -std=c++17 -Igenerated/cuda -o
// ll128_offset_probe tests/gpu/ll128_offset_probe.cu
#include "collgen_common.cuh"
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

typedef cg_bits<2>::E E;

__global__ void copy_units(const E* src, E* dst, long long n, int steps) {
  typedef cg_ll128 PR;
  const long long units = PR::units<E>(n);
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long u0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (int s = 0; s < steps; s++) {
    for (long long u = u0; PR::any(u < units); u += stride) {
      // Every lane calls ld and st (their shuffles name the whole warp);
      // a lane past the span reads zeros and writes nothing.
      const PR::P x = PR::ld(src, u, n);
      PR::st(dst, u, n, x);
    }
  }
}

static float run(const E* src, E* dst, long long n, int steps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  copy_units<<<68, 512>>>(src, dst, n, 1);
  cudaEventRecord(a);
  copy_units<<<68, 512>>>(src, dst, n, steps);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.0f / steps;
}

int main() {
  const int steps = 200;
  E *src, *dst;
  CHECK(cudaMalloc(&src, 64 << 20));
  CHECK(cudaMalloc(&dst, 64 << 20));
  CHECK(cudaMemset(src, 1, 64 << 20));
  for (long long bytes : {16LL << 10, 64LL << 10, 256LL << 10, 1LL << 20, 4LL << 20}) {
    const long long n = bytes / 2;
    const float al = run(src, dst, n, steps);
    const float off = run(src + 1, dst + 1, n, steps);
    const float cnt = run(src, dst, n - 1, steps);
    printf("%7lld KiB: aligned %.3f us, pointers +1 element %.3f us (%+.3f), count -1 %.3f us (%+.3f)\n", bytes >> 10, al, off, off - al, cnt, cnt - al);
    fflush(stdout);
  }
  CHECK(cudaGetLastError());
  return 0;
}
