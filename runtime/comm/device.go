package comm

import (
	"context"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
)

// device is everything the GPU backend needs from CUDA, IPC and NCCL: the
// shell that owns one rank's resources. gpuComm keeps the pure parts
// (topology, region layout, selection and refusal, argument packing, grid
// sizing, the status word's decoding) and reaches hardware only through
// this interface; cudaDevice (gpu_cuda.go, cgo builds) implements it over
// runtime/cuda, runtime/ipc and runtime/nccl, and CPU tests fake it.
//
// Ownership: the device frees everything it allocated, in reverse order,
// in release; gpuComm only holds addresses into it.
type device interface {
	// busID returns the PCI bus id of this rank's GPU ("0000:18:00.0").
	busID() (string, error)
	// classify classifies the GPUs at ids (every rank's bus id, by rank)
	// with NVML (runtime/topo); an error says why NVML cannot (no
	// libnvidia-ml, NVML unsupported, a GPU it does not know) and what to
	// do.
	classify(ids []string) (classification, error)
	// canAccessPeers probes, for each of ids, whether this rank's GPU can
	// access that GPU's memory (peerYes, peerNo, or peerUnknown where this
	// process cannot see the GPU).
	canAccessPeers(ids []string) ([]int, error)
	// ncclUnavailable says why NCCL cannot be loaded on this rank, or "".
	ncclUnavailable() string
	// openNCCL creates the NCCL communicator (collective over the store).
	openNCCL(ctx context.Context, key string, rank, world int) error
	// setup allocates and zeroes this rank's region of regionBytes and
	// exchanges it with every rank (collective), allocates and zeroes
	// seqBytes of sequence counters and the status word kernels report
	// timeouts in. It returns every rank's region base, by rank, and the
	// device addresses of the counters and the status word.
	setup(ctx context.Context, key string, regionBytes, seqBytes int64) (regions []cuda.DevicePtr, seq, status cuda.DevicePtr, err error)
	// symmetric allocates bytes on every rank (collective) in symmetric
	// memory that lookup then finds, and returns the local base. group
	// names the communicator's pool (made on first use).
	symmetric(ctx context.Context, group string, bytes int) (base cuda.DevicePtr, err error)
	// lookup reports whether the n bytes at p lie in a symmetric buffer
	// whose peers are this communicator's ranks (Alloc's, or one of a pool
	// given to UseSymmetric), with every rank's copy. It takes no lock
	// shared with other calls and allocates nothing: it runs on every call.
	lookup(p cuda.DevicePtr, n int64) (zeroCopy, bool)
	// preload compiles or loads kernels ks, ids[i] the index of ks[i] in
	// Config.Library.Kernels (New, unless Config.LazyKernels), so launch
	// finds them ready; a kernel that fails is a *KernelError naming it.
	preload(ctx context.Context, ks []*kernels.Kernel, ids []int) error
	// launch runs kernel k, the id-th of Config.Library.Kernels, on s
	// (nil: the device's own stream) with grid blocks of block threads and
	// args as its by-value argument struct, loading the kernel on first
	// use (Config.LazyKernels); early launches it with programmatic
	// dependent launch (only where earlyLaunch said so). It keeps nothing
	// of args once it returns: the caller reuses the buffer for its next
	// call. It runs on every call: with the kernel loaded it takes no lock
	// and allocates nothing.
	launch(k *kernels.Kernel, id int, grid, block uint32, args []byte, s *cuda.Stream, early bool) error
	// earlyLaunch reports whether launch can start kernels early
	// (cuda.Device.EarlyLaunch: sm_90 and a CUDA 12 driver).
	earlyLaunch() bool
	// smCount is the number of SMs of this rank's GPU.
	smCount() int
	// workQueues is the number of hardware work queues of this rank's
	// CUDA context (cuda.WorkQueues: CUDA_DEVICE_MAX_CONNECTIONS).
	workQueues() int
	// runNCCL hands a resolved call to NCCL on s.
	runNCCL(cl *call, s *cuda.Stream) error
	// copy enqueues a copy of bytes from src to dst (device memory) on s
	// (nil: the device's own stream): a one-rank communicator's calls.
	copy(dst, src cuda.DevicePtr, bytes int64, s *cuda.Stream) error
	// synchronize waits for s (nil: the device's own stream).
	synchronize(s *cuda.Stream) error
	// ncclError returns NCCL's asynchronous error, if any (nil without
	// NCCL).
	ncclError() error
	// status reads the status word (0: no kernel reported anything).
	status() uint64
	// cudaDevice and stream are the handles users see (nil in fakes).
	cudaDevice() *cuda.Device
	stream() *cuda.Stream
	// release frees what the device owns; the caller has made sure no
	// peer still reads it (Close's barrier) or that set-up failed.
	release() error
}
