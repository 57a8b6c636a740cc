// worksplit.cu: a host program (nvcc) that checks the barrier kernels' work
// split with the header's own index arithmetic (CG_HD functions of
// collgen_common.cuh): cg_copy, cg_copies and cg_reduce give vector v of a
// span to the thread whose first vector (cg_first_of) is v mod stride, and
// the tail past the last whole vector to lanes of the warp of vector
// nvec's owner (cg_tail_index). For every case it checks that each element
// of the span is handled by exactly one thread, and that the element's
// block (indeed its warp) is that of its vector's owner, whatever the
// span's length: so a round of a different length (a short last round)
// gives every element to the same block, which is what lets per-block
// barriers order rounds. Prints "ok N" (cases) or the first failure and
// exits 1. Run by TestWorkSplitOnHost (templates/cuda).
#include "collgen_common.cuh"
#include <cstdio>
#include <vector>

// owners fills owner[j] with the thread handling element j of an
// n-element span of vectors of V elements (-1: none, -2: more than one).
static void owners(std::vector<long long>& owner, long long n, int V, long long shift, long long stride) {
  owner.assign(n, -1);
  const long long nvec = n / V;
  for (long long gid = 0; gid < stride; gid++) {
    const long long first = cg_first_of(gid, shift, stride);
    for (long long v = first; v < nvec; v += stride)
      for (long long j = v * V; j < v * V + V; j++) owner[j] = owner[j] == -1 ? gid : -2;
    const long long i = nvec * V + cg_tail_index(first, nvec, stride);
    if (i < n) owner[i] = owner[i] == -1 ? gid : -2;
  }
}

int main() {
  const int vecs[] = {2, 4, 8, 16};  // elements per 16-byte vector: f64, f32, 16-bit, 8-bit
  const long long grids[][2] = {{1, 32}, {2, 96}, {3, 256}, {5, 512}, {128, 1024}};  // blocks, threads
  const int chunks[] = {0, 1, 3};
  const long long wins[] = {1, 5, 33, 1000, 70001};
  int cases = 0;
  std::vector<long long> full, part;
  for (int V : vecs)
    for (auto& g : grids)
      for (int c : chunks)
        for (long long win : wins) {
          const long long stride = g[0] * g[1], threads = g[1];
          const long long shift = cg_shift(c, (cg_u64)win, V);
          const long long s = cg_mod(shift, stride);
          owners(full, win, V, shift, stride);
          const long long shorter[] = {win - 1, win % 17, win / 3, 0};
          for (long long n : shorter) {
            if (n < 0) continue;
            owners(part, n, V, shift, stride);
            for (long long j = 0; j < n; j++) {
              const long long want = (j / V + s) % stride;  // owner of element j's vector
              const long long got = part[j];
              if (got < 0 || got / 32 != want / 32 || got / threads != want / threads || full[j] / threads != got / threads) {
                printf("V %d, %lld blocks of %lld, chunk %d, window %lld, round of %lld: element %lld handled by %s %lld (block %lld), its vector's owner is %lld (block %lld), the full window's %lld\n",
                       V, g[0], g[1], c, win, n, j, got == -2 ? "several threads, the last" : "thread", got,
                       got < 0 ? -1 : got / threads, want, want / threads, full[j]);
                return 1;
              }
            }
            cases++;
          }
          for (long long j = 0; j < win; j++)
            if (full[j] < 0) {
              printf("V %d, %lld blocks of %lld, chunk %d, window %lld: element %lld handled by %s\n", V, g[0], g[1], c, win, j,
                     full[j] == -1 ? "no thread" : "several threads");
              return 1;
            }
        }
  // Push kernels (cg_push_shift): every chunk's loop starts on a warp
  // boundary, and a chunk's units, from its start, end before the next
  // chunk's start and less than a warp before it.
  for (long long units = 1; units <= 300; units++)
    for (int c = 0; c < 9; c++) {
      const long long s = cg_push_shift(c, units), next = cg_push_shift(c + 1, units);
      if (s % 32 != 0 || next - s < units || next - s >= units + 32) {
        printf("cg_push_shift(%d, %lld) = %lld, chunk %d starts at %lld\n", c, units, s, c + 1, next);
        return 1;
      }
      cases++;
    }
  printf("ok %d\n", cases);
  return 0;
}
