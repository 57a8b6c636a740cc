// signal.cu: the one-block kernel behind runtime/symm's stream-ordered
// PutSignal, WaitSignal and Barrier on the CUDA backend (cuda_signal.go
// lays out the argument struct; keep the two in step).
#include "collgen_symm.cuh"

#define CG_SYMM_MAX_PEERS 63

struct cg_symm_signal_args {
  unsigned int* put[CG_SYMM_MAX_PEERS];   // this rank's word in peer i's pad
  unsigned int* wait[CG_SYMM_MAX_PEERS];  // peer i's word in this rank's pad
  int peers[CG_SYMM_MAX_PEERS];           // the peers, for reports
  int npeers;
  int op;  // CG_SYMM_OP_*
  int rank;
  int channel;
  cg_symm_u64 timeout_ns;
  unsigned int* status;  // host-mapped status words
  unsigned int* broken;  // device word, nonzero after a timeout
};
static_assert(sizeof(cg_symm_signal_args) == 1304, "cg_symm_signal_args layout (cuda_signal.go)");

// cg_symm_signal runs one signal operation with one thread per peer: puts
// first (a barrier's put to peer i, then its wait for peer i), all within
// one deadline. It does nothing once the status says a timeout happened.
extern "C" __global__ void __launch_bounds__(64) cg_symm_signal(const cg_symm_signal_args a) {
  const cg_symm_report r = {a.status, a.broken, a.op, a.rank, a.channel, cg_symm_now_ns()};
  if (cg_symm_is_broken(a.broken)) return;
  const cg_symm_u64 deadline = r.start + a.timeout_ns;
  for (int i = threadIdx.x; i < a.npeers; i += blockDim.x) {
    if (a.op != CG_SYMM_OP_WAIT && !cg_symm_put_word(a.put[i], deadline, r, a.peers[i])) return;
    if (a.op != CG_SYMM_OP_PUT && !cg_symm_wait_word(a.wait[i], deadline, r, a.peers[i])) return;
  }
}
