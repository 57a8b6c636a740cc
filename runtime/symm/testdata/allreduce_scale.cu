// allreduce_scale.cu: a fused all-reduce plus scale over symmetric memory,
// the worked example of docs/symmetric-memory.md ("Custom kernels"). Every
// rank's symmetric buffer holds n floats of input; every rank writes
// out[i] = scale * (in_0[i] + in_1[i] + ... + in_{W-1}[i]), reading the
// peers' buffers directly. Ranks add in rank order, so all ranks get the
// same bits.
#include "collgen_symm.cuh"

struct allreduce_scale_args {
  cg_symm_group g;      // Handle.KernelGroup (56 bytes)
  float* out;           // this rank's output: n floats, any device memory
  unsigned long long n; // elements
  float scale;
  int channel;          // block b signals on channel + b (channels >= channel + grid)
};                      // 80 bytes

// Peers' data is read with ld.global.cg (L2 only): no stale L1 line.
__device__ __forceinline__ float ld_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

extern "C" __global__ void allreduce_scale(const allreduce_scale_args a) {
  const int ch = a.channel + blockIdx.x;
  // 1. Every rank's input is in place: what each rank stored before this
  //    kernel (earlier in its stream) is visible after the barrier.
  if (!cg_symm_barrier(a.g, ch)) return;  // timed out: the host's Synchronize reports it
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    float acc = 0.0f;
    for (int r = 0; r < a.g.world; r++) acc += ld_cg((const float*)a.g.buffers[r] + i);
    a.out[i] = acc * a.scale;
  }
  // 2. No rank overwrites or frees its input while a peer still reads it:
  //    block b of every rank has finished reading once this returns.
  cg_symm_barrier(a.g, ch);
}
