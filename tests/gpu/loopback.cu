// loopback.cu: a generated collective kernel at world W on ONE GPU. Every
// rank's buffers (input, output, stage, scratch, signal pad, sequence
// words) are separate allocations on device 0, and the W ranks' kernels
// run concurrently, one stream each, inside one CUDA graph, so they meet
// through device memory as they would over NVLink, only nearer. It checks
// the result (sums of small integers, exact in bf16, f16 and f32, the
// same bits on every rank; all-gather: every block in place) and times
// graph replays: a check of a kernel's logic (indices, tails, flags,
// rounds of the epoch) and of its local costs when no 2-GPU machine is
// lent. It is not the proof (docs/proof.md): peers' memory
// is local, so no NVLink ordering is exercised, and the times leave out the
// link. Grids are capped so that W kernels fit on the GPU at once.
//
// Build from the repository root, per kernel program:
//   nvcc -O3 -arch=sm_90 -std=c++17 -Igenerated/cuda -DWORLD=2 -DTHREADS=512 \
//     -DKFILE='"allreduce_oneshot_ll128_bf16_w2.cu"' -DKNAME=allreduce_oneshot_ll128_bf16_w2 \
//     -o loopback tests/gpu/loopback.cu && ./loopback
// THREADS is the kernel's block size (its __launch_bounds__); COLL the
// collective, 0 all-reduce (default), 1 reduce-scatter, 2 all-gather;
// DTYPE the element type, 0 bf16 (default; all-gather: u16), 1 f16, 2
// f32 (all-gather: u32); PROTO its protocol, 0 barrier (default), 1 LL,
// 2 LL128, 3 Lamport, for the grid: as the runtime's (gridFor), a thread per unit of
// every chunk, each chunk's units rounded up to a warp (as
// kernels.ThreadUnits does for barrier kernels, and for push kernels on
// the branch warp-chunks; where it does not, a kernel gets a few spare
// threads, never too few).
// Optional -DGRID_CAP=n (blocks per rank, default 64/WORLD).
// tests/gpu/loopback.sh builds and runs a directory's programs.
#include KFILE
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#ifndef COLL
#define COLL 0
#endif
#ifndef PROTO
#define PROTO 0
#endif
#ifndef DTYPE
#define DTYPE 0
#endif
#ifndef GRID_CAP
#define GRID_CAP (64 / WORLD)
#endif

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

typedef collgen_args<WORLD> Args;

// Bits holds one element; bits_of_int is integer v in the element type,
// exact for |v| < 256 (sums of W values in -8..8).
#if DTYPE == 2
typedef unsigned Bits;
#else
typedef unsigned short Bits;
#endif
static Bits bits_of_int(int v) {
  float f = (float)v;
  unsigned u;
  memcpy(&u, &f, 4);
  if (DTYPE == 2) return (Bits)u;
  if (DTYPE == 0) return (Bits)(u >> 16);  // bf16: the float's top half
  // f16: sign, exponent biased by 15, ten mantissa bits.
  if (v == 0) return 0;
  const unsigned a = v < 0 ? -v : v;
  int e = 0;
  while ((a >> (e + 1)) != 0) e++;
  return (Bits)((v < 0 ? 0x8000u : 0u) | (unsigned)(e + 15) << 10 | ((a << (10 - e)) & 0x3ffu));
}

struct Rank {
  char *in, *out, *stage, *scratch;
  cg_u64 *signal, *seq, *status;
  cudaStream_t s;
};

// value is rank p's input element i.
static int value(long long i, int p) { return (int)((i * 7 + p * 3) % 17) - 8; }

// want is element i of rank r's output.
static int want(long long i, int r, long long count) {
  int sum = 0;
  if (COLL == 2) {
    sum = value(i % count, (int)(i / count));  // block q is rank q's input
  } else {
    for (int p = 0; p < WORLD; p++) sum += value(COLL == 1 ? r * count + i : i, p);
  }
  return sum;
}

// run sets up collectives of count elements (all-reduce: the buffer;
// reduce-scatter and all-gather: per rank), pointers `off` elements into
// their allocations, checks three, then times `reps` replays of a graph
// of `per` collectives; returns us per collective, or -1 on a wrong
// result.
static double run(long long count, int off, int reps, int per) {
  const int esz = sizeof(Bits);
  const long long vec = 16 / esz;
  // n: the full buffer's elements (the kernels' count argument); chunk:
  // schedule.ChunkElems.
  const long long n = COLL == 0 ? count : count * WORLD;
  long long chunk = count;
  if (COLL == 0) {
    chunk = (n + WORLD - 1) / WORLD;
    chunk = (chunk + vec - 1) / vec * vec;
  }
  const long long inN = COLL == 2 ? count : n, outN = COLL == 1 ? count : n;
  const long long bytes = (n + 64) * esz;
  // A slot holds W*W chunk areas, rounded up to 4 KiB: the runtime's
  // areas are aligned (an LL128 line must start on a 128-byte boundary).
  const cg_u64 slot = ((cg_u64)WORLD * WORLD * (2 * chunk * esz + 8192) + 4095) & ~(cg_u64)4095;
  std::vector<Rank> rk(WORLD);
  for (auto& r : rk) {
    CHECK(cudaMalloc(&r.in, bytes));
    CHECK(cudaMalloc(&r.out, bytes));
    CHECK(cudaMalloc(&r.stage, 2 * slot));
    CHECK(cudaMalloc(&r.scratch, 2 * slot));
    CHECK(cudaMalloc(&r.signal, CG_MAX_BLOCKS * WORLD * 8 * 4));
    CHECK(cudaMalloc(&r.seq, (CG_MAX_BLOCKS + 3) * 8));
    CHECK(cudaMalloc(&r.status, 64));
    CHECK(cudaMemset(r.stage, 0, 2 * slot));
    CHECK(cudaMemset(r.scratch, 0, 2 * slot));
    CHECK(cudaMemset(r.signal, 0, CG_MAX_BLOCKS * WORLD * 8 * 4));
    CHECK(cudaMemset(r.seq, 0, (CG_MAX_BLOCKS + 3) * 8));
    CHECK(cudaMemset(r.status, 0, 64));
    CHECK(cudaMemset(r.out, 0xff, bytes));
    CHECK(cudaStreamCreateWithFlags(&r.s, cudaStreamNonBlocking));
  }
  std::vector<Bits> h(inN);
  for (int r = 0; r < WORLD; r++) {
    for (long long i = 0; i < inN; i++) h[i] = bits_of_int(value(i, r));
    CHECK(cudaMemcpy(rk[r].in + off * esz, h.data(), inN * esz, cudaMemcpyHostToDevice));
  }
  CHECK(cudaDeviceSynchronize());  // the set-up's memsets and copies, before any stream's work
  std::vector<Args> a(WORLD);
  for (int r = 0; r < WORLD; r++) {
    memset(&a[r], 0, sizeof(Args));
    a[r].input = rk[r].in + off * esz;
    a[r].output = rk[r].out + off * esz;
    for (int p = 0; p < WORLD; p++) {
      a[r].stage[p] = rk[p].stage;
      a[r].scratch[p] = rk[p].scratch;
      a[r].signal[p] = rk[p].signal;
    }
    a[r].seq = rk[r].seq;
    a[r].status = rk[r].status;
    a[r].count = n;
    a[r].chunk = chunk;
    a[r].timeout_ns = 2000000000ull;
    a[r].slot_bytes = slot;
    a[r].window = 0;
    a[r].rank = r;
    a[r].op = CG_OP_SUM;
  }
  // A chunk's units: 16-byte vectors or Lamport lines (16 payload bytes),
  // LL lines (8 payload bytes) or LL128 eighths of a line (120 payload
  // bytes a line), rounded up to a warp.
  long long units = PROTO == 1 ? (chunk * esz + 7) / 8 : PROTO == 2 ? (chunk * esz + 119) / 120 * 8 : (chunk * esz + 15) / 16;  // 0, 3
  units = (units + 31) / 32 * 32;
  long long grid = (WORLD * units + THREADS - 1) / THREADS;
  grid = grid < 1 ? 1 : grid > GRID_CAP ? GRID_CAP : grid;
  // The graph: stream 0 forks to the others, each runs `per` kernels of
  // its rank, stream 0 joins them.
  cudaStream_t s0 = rk[0].s;
  std::vector<cudaEvent_t> ev(WORLD);
  for (auto& e : ev) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  auto graph_of = [&](int k) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeGlobal));
    CHECK(cudaEventRecord(ev[0], s0));
    for (int r = 1; r < WORLD; r++) CHECK(cudaStreamWaitEvent(rk[r].s, ev[0], 0));
    for (int i = 0; i < k; i++)
      for (int r = 0; r < WORLD; r++) {
        KNAME<<<(unsigned)grid, THREADS, 0, rk[r].s>>>(a[r]);
        CHECK(cudaGetLastError());
      }
    for (int r = 1; r < WORLD; r++) {
      CHECK(cudaEventRecord(ev[r], rk[r].s));
      CHECK(cudaStreamWaitEvent(s0, ev[r], 0));
    }
    CHECK(cudaStreamEndCapture(s0, &g));
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiateWithFlags(&x, g, 0));
    CHECK(cudaGraphDestroy(g));
    return x;
  };
  cudaGraphExec_t one = graph_of(1), many = graph_of(per);
  double result = 0;
  std::vector<Bits> got(outN);
  // Three collectives one by one, each checked on cleared outputs: the
  // first on fresh buffers, the next two on the other stage slot and back.
  for (int rep = 0; rep < 3 && result == 0; rep++) {
    // Each collective must write it all. On s0, ahead of the graph: a
    // plain cudaMemset (the legacy stream) is not ordered with the
    // non-blocking streams and could land after the kernels.
    for (auto& r : rk) CHECK(cudaMemsetAsync(r.out, 0xff, bytes, s0));
    CHECK(cudaGraphLaunch(one, s0));
    CHECK(cudaStreamSynchronize(s0));
    for (int r = 0; r < WORLD && result == 0; r++) {
      cg_u64 st = 0;
      CHECK(cudaMemcpy(&st, rk[r].status, 8, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(got.data(), rk[r].out + off * esz, outN * esz, cudaMemcpyDeviceToHost));
      for (long long i = 0; i < outN; i++) {
        const int sum = want(i, r, count);
        if (st != 0 || got[i] != bits_of_int(sum)) {
          printf("  count=%lld off=%d collective %d: rank %d element %lld is %#x, want %#x (status %#llx)\n", count, off, rep, r, i, (unsigned)got[i], (unsigned)bits_of_int(sum), (unsigned long long)st);
          result = -1;
          break;
        }
      }
      Bits guard = 0;
      CHECK(cudaMemcpy(&guard, rk[r].out + (off + outN) * esz, esz, cudaMemcpyDeviceToHost));
      if (result == 0 && guard != (Bits)~(Bits)0) {
        printf("  count=%lld off=%d: rank %d wrote past its output\n", count, off, r);
        result = -1;
      }
    }
  }
  if (result == 0) {
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    CHECK(cudaGraphLaunch(many, s0));
    CHECK(cudaEventRecord(t0, s0));
    for (int i = 0; i < reps; i++) CHECK(cudaGraphLaunch(many, s0));
    CHECK(cudaEventRecord(t1, s0));
    CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    result = ms * 1000.0 / ((double)reps * per);
    cg_u64 st = 0;
    for (int r = 0; r < WORLD; r++) {
      CHECK(cudaMemcpy(&st, rk[r].status, 8, cudaMemcpyDeviceToHost));
      if (st != 0) {
        printf("  count=%lld off=%d: rank %d status %#llx after the timed replays\n", count, off, r, (unsigned long long)st);
        result = -1;
      }
    }
  }
  CHECK(cudaGraphExecDestroy(one));
  CHECK(cudaGraphExecDestroy(many));
  for (auto& r : rk) {
    cudaFree(r.in); cudaFree(r.out); cudaFree(r.stage); cudaFree(r.scratch);
    cudaFree(r.signal); cudaFree(r.seq); cudaFree(r.status);
    cudaStreamDestroy(r.s);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return result;
}

int main() {
  int bad = 0;
  static const char* const names[] = {"all-reduce", "reduce-scatter", "all-gather"};
  printf("%s (world %d, %d threads, at most %d blocks per rank), us per %s; sizes are the larger buffer's:\n", KFILE, WORLD, THREADS, GRID_CAP, names[COLL]);
  std::vector<long long> sizes = {1, 16, 64, 256, 1024, 4096};
  if (const char* e = getenv("LOOPBACK_KIB")) {  // e.g. "1,64"
    sizes.clear();
    for (const char* p = e; *p;) {
      sizes.push_back(strtoll(p, (char**)&p, 10));
      if (*p == ',') p++;
    }
  }
  for (long long kib : sizes) {
    const long long n = kib * 1024 / (long long)sizeof(Bits) / (COLL == 0 ? 1 : WORLD);
    const double al = run(n, 0, 20, 20), cnt = run(n - 1, 0, 20, 20), off = run(n, 1, 20, 20);
    bad += (al < 0) + (cnt < 0) + (off < 0);
    printf("%7lld KiB: aligned %.3f, count -1 %.3f, pointers +1 element %.3f\n", kib, al, cnt, off);
    fflush(stdout);
  }
  printf("%s\n", bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}
