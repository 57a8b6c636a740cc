// Kernels of runtime/symm's GPU tests (cuda_test.go), over collgen_symm.cuh.
#include "collgen_symm.cuh"

struct group_args {
  cg_symm_group g;  // 56 bytes
};

#define SLOT 256

// poke writes q*1000+i into slot `rank` of every rank's buffer (device
// stores into peers' memory), meets every rank in a barrier on channel 0,
// then checks the slots every rank wrote into this rank's buffer and
// counts mismatches in word SLOT*world. One block of SLOT threads.
extern "C" __global__ void poke(const group_args a) {
  const int i = threadIdx.x;
  for (int q = 0; q < a.g.world; q++)
    ((unsigned int*)a.g.buffers[q])[SLOT * a.g.rank + i] = 1000u * a.g.rank + i;
  if (!cg_symm_barrier(a.g, 0)) return;
  unsigned int* own = (unsigned int*)a.g.buffers[a.g.rank];
  for (int q = 0; q < a.g.world; q++)
    if (own[SLOT * q + i] != 1000u * q + i) atomicAdd(own + SLOT * a.g.world, 1u);
}

// inc adds one to word 0 of this rank's buffer.
extern "C" __global__ void inc(const group_args a) {
  if (threadIdx.x == 0) ((unsigned int*)a.g.buffers[a.g.rank])[0] += 1;
}

// check counts, in word 1 of this rank's buffer, the peers whose word 0
// differs from this rank's.
extern "C" __global__ void check(const group_args a) {
  if (threadIdx.x != 0) return;
  unsigned int* own = (unsigned int*)a.g.buffers[a.g.rank];
  for (int q = 0; q < a.g.world; q++) {
    if (q == a.g.rank) continue;
    if (cg_symm_ld_relaxed((const unsigned int*)a.g.buffers[q]) != own[0]) own[1] += 1;
  }
}

struct loop_args {
  cg_symm_group g;  // 56 bytes
  int iters;
  int ch;
};  // 64 bytes

// barrier_loop runs iters device barriers on channel ch (one block): the
// signal protocol's round trip without a kernel launch per operation.
extern "C" __global__ void barrier_loop(const loop_args a) {
  for (int i = 0; i < a.iters; i++)
    if (!cg_symm_barrier(a.g, a.ch)) return;
}

// pingpong_loop runs iters put/wait round trips between ranks 0 and 1
// (rank 0 puts first) on channel ch, in thread 0.
extern "C" __global__ void pingpong_loop(const loop_args a) {
  if (threadIdx.x != 0) return;
  const int peer = 1 - a.g.rank;
  for (int i = 0; i < a.iters; i++) {
    if (a.g.rank == 0) {
      if (!cg_symm_put(a.g, peer, a.ch) || !cg_symm_wait(a.g, peer, a.ch)) return;
    } else {
      if (!cg_symm_wait(a.g, peer, a.ch) || !cg_symm_put(a.g, peer, a.ch)) return;
    }
  }
}
