// collgen_symm.cuh: device functions for kernels over runtime/symm's
// symmetric memory (the CUDA backend): the pointer arrays of a Handle and
// put/wait/barrier on its signal pads, with deadlines that report a silent
// peer instead of hanging. Self-contained (no CUDA headers), so NVRTC and
// nvcc compile it alike; symm.CompileKernel adds it to NVRTC's include set,
// and symm's own stream-ordered signals are built from it.
//
// Signal words. Rank r's pad holds channels x world words of 4 bytes; word
// (ch, s) of rank r's pad, at pads[r][ch * world + s], is written only by
// rank s (put: 0 -> 1) and cleared only by rank r (wait: 1 -> 0), so the
// words reset themselves and consecutive rounds can use one channel.
//
// Memory ordering (the same PTX as the generated kernels' barriers):
//   put  waits (relaxed loads) until the word is 0, the previous signal
//        consumed, then stores 1 with st.release.sys: every store this
//        thread made, or saw through a __syncthreads(), before the put is
//        visible to the peer once its wait returns;
//   wait spins with ld.acquire.sys until the word is 1, then stores 0
//        (only the owner clears, only the sender sets, so a plain store
//        does what a compare-and-swap 1 -> 0 would);
//   barrier: __syncthreads(), a put to and a wait for every other rank
//        (one thread per peer), __syncthreads(): what any rank stored
//        before its barrier is visible to every thread of the block on
//        every rank after its own.
// Work earlier on the stream (kernels, copies) is ordered before a kernel
// that signals, as usual in stream order.
//
// Deadlines. Every spin reads %globaltimer; past the deadline the first
// thread to give up (of any kernel using the same status words) records
// what it waited for in the host-mapped status words and sets *broken,
// and the call returns false. Later calls return false at once while
// *broken is set, so one dead peer costs one deadline, not one per call.
// The host turns the report into a *symm.TimeoutError naming the rank,
// peer and channel (StreamOrdering.Synchronize, Err).
#pragma once

typedef unsigned long long cg_symm_u64;

// Operation codes in the status report (symm.SignalKind).
#define CG_SYMM_OP_PUT 1
#define CG_SYMM_OP_WAIT 2
#define CG_SYMM_OP_BARRIER 3

// Status words (host-mapped, 8 x 4 bytes): [0] 1 once a timeout was
// reported (written last), [1] op, [2] 1 if the wait was for the peer to
// consume a previous signal, [3] rank, [4] peer, [5] channel, [6..7] how
// long the operation waited, in ns.
#define CG_SYMM_STATUS_WORDS 8

// cg_symm_group is what a kernel needs to reach a symm Handle's memory and
// signal on it; the host builds it with Handle.KernelGroup (56 bytes, laid
// out as below on 64-bit hosts). Pass it by value inside the kernel's
// argument struct.
struct cg_symm_group {
  void* const* buffers;        // Handle.BufferPtrsDev: every rank's buffer, as mapped on this GPU
  unsigned int* const* pads;   // Handle.SignalPadPtrsDev: every rank's signal pad
  unsigned int* status;        // the StreamOrdering's host-mapped status words
  unsigned int* broken;        // the StreamOrdering's device word, nonzero after a timeout
  cg_symm_u64 timeout_ns;      // deadline of one put, wait or barrier
  int rank;                    // this rank
  int world;                   // the number of ranks
  int channels;                // signal channels per pad
  int reserved;
};

// cg_symm_report names the operation a spin belongs to, for the status words.
struct cg_symm_report {
  unsigned int* status;
  unsigned int* broken;
  int op;
  int rank;
  int channel;
  cg_symm_u64 start;
};

__device__ __forceinline__ cg_symm_u64 cg_symm_now_ns() {
  cg_symm_u64 t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void cg_symm_st_release(unsigned int* p, unsigned int v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void cg_symm_st_relaxed(unsigned int* p, unsigned int v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int cg_symm_ld_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned int cg_symm_ld_relaxed(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// cg_symm_is_broken reports whether a timeout was already reported.
__device__ __forceinline__ bool cg_symm_is_broken(const unsigned int* broken) {
  return cg_symm_ld_relaxed(broken) != 0;
}

// cg_symm_report_timeout records the first timeout: it wins *broken, fills
// the status words and publishes them with the code word last.
__device__ __noinline__ void cg_symm_report_timeout(const cg_symm_report& r, int peer, int consume) {
  if (atomicCAS(r.broken, 0u, 1u) != 0u) return;  // another thread reported first
  volatile unsigned int* st = r.status;
  const cg_symm_u64 waited = cg_symm_now_ns() - r.start;
  st[1] = (unsigned int)r.op;
  st[2] = (unsigned int)consume;
  st[3] = (unsigned int)r.rank;
  st[4] = (unsigned int)peer;
  st[5] = (unsigned int)r.channel;
  st[6] = (unsigned int)waited;
  st[7] = (unsigned int)(waited >> 32);
  __threadfence_system();
  st[0] = 1u;
}

// cg_symm_put_word signals through w, the caller's word in peer's pad:
// it waits until the previous signal was consumed, then stores 1 with
// release semantics. False after a timeout (reported) or when broken.
__device__ __forceinline__ bool cg_symm_put_word(unsigned int* w, cg_symm_u64 deadline, const cg_symm_report& r, int peer) {
  if (cg_symm_ld_relaxed(w) != 0u) {
    while (cg_symm_ld_relaxed(w) != 0u) {
      if (cg_symm_is_broken(r.broken)) return false;
      if (cg_symm_now_ns() > deadline) {
        cg_symm_report_timeout(r, peer, 1);
        return false;
      }
    }
  }
  cg_symm_st_release(w, 1u);
  return true;
}

// cg_symm_wait_word consumes a signal in w, peer's word in the caller's
// own pad: it spins with acquire loads until the word is 1, then clears it.
// False after a timeout (reported) or when broken.
__device__ __forceinline__ bool cg_symm_wait_word(unsigned int* w, cg_symm_u64 deadline, const cg_symm_report& r, int peer) {
  if (cg_symm_ld_acquire(w) == 0u) {
    while (cg_symm_ld_acquire(w) == 0u) {
      if (cg_symm_is_broken(r.broken)) return false;
      if (cg_symm_now_ns() > deadline) {
        cg_symm_report_timeout(r, peer, 0);
        return false;
      }
    }
  }
  cg_symm_st_relaxed(w, 0u);
  return true;
}

// cg_symm_word is the address of sender's word for channel ch in owner's pad.
__device__ __forceinline__ unsigned int* cg_symm_word(const cg_symm_group& g, int owner, int ch, int sender) {
  return g.pads[owner] + (cg_symm_u64)ch * g.world + sender;
}

__device__ __forceinline__ cg_symm_report cg_symm_make_report(const cg_symm_group& g, int op, int ch) {
  cg_symm_report r = {g.status, g.broken, op, g.rank, ch, cg_symm_now_ns()};
  return r;
}

// cg_symm_put signals peer on channel ch. Call it from one thread, after
// the stores it should publish (and a __syncthreads() if other threads of
// the block made them). False after a timeout or once the group is broken.
__device__ __forceinline__ bool cg_symm_put(const cg_symm_group& g, int peer, int ch) {
  const cg_symm_report r = cg_symm_make_report(g, CG_SYMM_OP_PUT, ch);
  if (cg_symm_is_broken(g.broken)) return false;
  return cg_symm_put_word(cg_symm_word(g, peer, ch, g.rank), r.start + g.timeout_ns, r, peer);
}

// cg_symm_wait consumes peer's signal on channel ch. Call it from one
// thread; the stores peer made before its put are visible to this thread
// afterwards (and to the block after a __syncthreads()).
__device__ __forceinline__ bool cg_symm_wait(const cg_symm_group& g, int peer, int ch) {
  const cg_symm_report r = cg_symm_make_report(g, CG_SYMM_OP_WAIT, ch);
  if (cg_symm_is_broken(g.broken)) return false;
  return cg_symm_wait_word(cg_symm_word(g, g.rank, ch, peer), r.start + g.timeout_ns, r, peer);
}

// cg_symm_barrier is a barrier of this block with the blocks of every
// other rank that use channel ch. Every thread of the block must call it;
// it returns the same value on all of them (false after a timeout). A
// kernel of several blocks gives each block its own channel (for example
// base + blockIdx.x), since a channel's words carry one signal at a time.
__device__ __forceinline__ bool cg_symm_barrier(const cg_symm_group& g, int ch) {
  const cg_symm_report r = cg_symm_make_report(g, CG_SYMM_OP_BARRIER, ch);
  int failed = 0;
  __syncthreads();  // the block's earlier stores happen before the puts
  if (cg_symm_is_broken(g.broken)) {
    failed = 1;
  } else {
    const cg_symm_u64 deadline = r.start + g.timeout_ns;
    for (int p = threadIdx.x; p < g.world; p += blockDim.x) {
      if (p == g.rank) continue;
      if (!cg_symm_put_word(cg_symm_word(g, p, ch, g.rank), deadline, r, p) ||
          !cg_symm_wait_word(cg_symm_word(g, g.rank, ch, p), deadline, r, p)) {
        failed = 1;
        break;
      }
    }
  }
  // The waits' acquires happen before the rest of the block's loads.
  return !__syncthreads_or(failed);
}
