// Kernels for runtime/cuda's GPU tests. Compiled by NVRTC in the tests and
// by nvcc (-fatbin) in tests/gpu/run.sh for the fatbin test.
#include "collgen_test.cuh"

// out[i] = sum over w < world of in[w][i]. in[w] may be a peer GPU's memory.
extern "C" __global__ void sum_w4(const collgen_args_w4 a) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < a.n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < a.world; w++) s += a.in[w][i];
    a.out[i] = s;
  }
}

// x[i] += add.
extern "C" __global__ void inc(const inc_args a) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < a.n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    a.x[i] += a.add;
  }
}

// Handshake through mapped host memory: set flag[0]=value, wait (bounded)
// for the host to set flag[1] != 0, then set flag[0]=value+1, or value+2
// on timeout.
extern "C" __global__ void flag_handshake(const flag_args a) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  a.flag[0] = a.value;
  __threadfence_system();
  unsigned long long i = 0;
  while (a.flag[1] == 0 && i < a.spins) {
    i++;
    __nanosleep(1000);
  }
  a.flag[0] = a.flag[1] != 0 ? a.value + 1 : a.value + 2;
  __threadfence_system();
}

// out[i] = v[i] for i < 256.
extern "C" __global__ void big_arg(const big_args a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 256) a.out[i] = a.v[i];
}
