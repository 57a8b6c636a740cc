// Package symm is symmetric memory for collgen, after PyTorch's
// SymmetricMemory: every rank of a group allocates a buffer locally
// (Pool.Alloc, or Pool.AllocPersistent for a fixed address), a collective
// and cached Pool.Rendezvous maps every rank's buffer into every rank
// (Handle.Peer, Handle.BufferPtrs), and per-allocation signal pads give
// put/wait/barrier with deadlines (Handle.PutSignal, WaitSignal, Barrier):
// a dead or silent peer is a *TimeoutError naming it and the channel,
// never a hang. Lookup tells, without a lock, whether a pointer lies in a
// live symmetric allocation.
//
// The pool runs over a Backend. The host twin (NewHostBackend) shares CPU
// memory through memfd between ranks that are goroutines of one process or
// processes of one host; descriptors travel over Unix sockets with
// SCM_RIGHTS (package fdpass), only between processes of one user. The
// CUDA backend (NewCUDABackend, with cgo) builds the same from CUDA VMM
// memory on one GPU per rank: signals run in a stream's order
// (StreamOrdering; capturable in CUDA graphs, timeouts reported at
// Synchronize), Handle.BufferPtrsDev and SignalPadPtrsDev are the pointer
// arrays in device memory, and CompileKernel compiles users' kernels
// against collgen_symm.cuh (DeviceHeader), whose device put, wait and
// barrier match the signals' memory ordering. docs/symmetric-memory.md
// describes the design: memory ordering, who frees what, the CUDA backend
// and custom kernels.
//
// The package is built on Linux (amd64, arm64), where memfd, abstract Unix
// sockets and SO_PEERCRED exist.
package symm
