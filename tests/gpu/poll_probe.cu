// poll_probe.cu: what an LL128 poll in a row costs on one GPU (the question
// behind the branch poll-together, docs/gpu-workflow.md). Every warp polls
// K inbox lines per step, lines whose flag is already set (as when the
// peer's data has arrived), for many steps, two ways:
//   serial: K polls one after another (the shipped form: __syncwarp, a
//           16-byte volatile load, the flag thread's shuffle, then the next)
//   split:  one __syncwarp, K loads, then K shuffles (the branch's form)
// and prints microseconds per step for K = 1..8. The difference per extra
// line is the latency a reduce over K inboxes pays per unit in the shipped
// kernels. Build and run: nvcc -O3 -arch=sm_90 -o poll_probe poll_probe.cu && ./poll_probe
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ uint4 ld_line(const uint4* p) {
  uint4 d;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(d.x), "=r"(d.y), "=r"(d.z), "=r"(d.w) : "l"(p) : "memory");
  return d;
}

__device__ __forceinline__ bool flag_ok(const uint4& d, unsigned flag) {
  const bool mine = d.z == flag && d.w == flag;
  return __shfl_sync(0xffffffffu, (int)mine, (int)(threadIdx.x & 31) | 7) != 0;
}

// The kernels' form: a lane past the span (on false) loads nothing and
// answers true, so the load sits in a branch.
__device__ __forceinline__ void ld_on(const uint4* p, uint4& d, bool on) {
  d.x = d.y = d.z = d.w = 0u;
  if (on) d = ld_line(p);
}
__device__ __forceinline__ bool flag_on(const uint4& d, unsigned flag, bool on) {
  const bool mine = !on || (d.z == flag && d.w == flag);
  return __shfl_sync(0xffffffffu, (int)mine, (int)(threadIdx.x & 31) | 7) != 0;
}

// lines: K regions of `span` lines (128 bytes, 8 units of 16 bytes) each;
// limit (above every unit) makes `on` a run-time value, as in the kernels.
template <int K, bool SPLIT>
__global__ void poll(const uint4* lines, size_t span, int steps, unsigned flag, size_t limit, unsigned* out) {
  const size_t units = span * 8;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (int s = 0; s < steps; s++, u = (u + stride) % units) {
    const bool on = u < limit;
    uint4 d[K];
    bool ok = true;
    if (SPLIT) {
      __syncwarp();
#pragma unroll
      for (int k = 0; k < K; k++) ld_on(lines + k * units + u, d[k], on);
#pragma unroll
      for (int k = 0; k < K; k++) ok &= flag_on(d[k], flag, on);
    } else {
#pragma unroll
      for (int k = 0; k < K; k++) {
        __syncwarp();
        ld_on(lines + k * units + u, d[k], on);
        ok &= flag_on(d[k], flag, on);
      }
    }
    if (!__all_sync(0xffffffffu, ok)) acc += 1000000;  // never: every flag is set
#pragma unroll
    for (int k = 0; k < K; k++) acc += d[k].x;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int K, bool SPLIT>
static float run(const uint4* lines, size_t span, int blocks, int steps, unsigned* out) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const size_t limit = span * 8;
  poll<K, SPLIT><<<blocks, 512>>>(lines, span, steps, 1u, limit, out);  // warm-up
  cudaEventRecord(a);
  for (int i = 0; i < 5; i++) poll<K, SPLIT><<<blocks, 512>>>(lines, span, steps, 1u, limit, out);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.0f / 5 / steps;  // us per step
}

template <int K>
static void row(const uint4* lines, size_t span, int blocks, int steps, unsigned* out) {
  const float s = run<K, false>(lines, span, blocks, steps, out), p = run<K, true>(lines, span, blocks, steps, out);
  printf("%d lines: serial %.3f us/step, split %.3f us/step, saved %.3f\n", K, s, p, s - p);
}

int main() {
  const int K = 8, blocks = 68, steps = 2000;  // 68 blocks of 512: a 1 MiB two-shot's grid
  const size_t span = 1 << 16;                 // lines per region: 8 MiB each, 64 MiB in all, past L2
  uint4* lines;
  unsigned* out;
  CHECK(cudaMalloc(&lines, K * span * 128));
  CHECK(cudaMalloc(&out, blocks * 512 * sizeof(unsigned)));
  // Every 16-byte unit {x, y, flag, flag}: the flag check passes everywhere.
  uint4* h = new uint4[K * span * 8];
  for (size_t i = 0; i < K * span * 8; i++) h[i] = make_uint4((unsigned)i, 0u, 1u, 1u);
  CHECK(cudaMemcpy(lines, h, K * span * 128, cudaMemcpyHostToDevice));
  delete[] h;
  // L2-resident lines (what a peer's NVLink stores just wrote), then lines
  // in HBM.
  for (size_t sp : {span / 16, span}) {
    printf("regions of %zu KiB:\n", sp * 128 / 1024);
    row<1>(lines, sp, blocks, steps, out);
    row<2>(lines, sp, blocks, steps, out);
    row<3>(lines, sp, blocks, steps, out);
    row<4>(lines, sp, blocks, steps, out);
    row<8>(lines, sp, blocks, steps, out);
  }
  CHECK(cudaGetLastError());
  return 0;
}
