// Package comm is the Communicator users call: all-reduce, reduce-scatter and
// all-gather over a group of ranks, on GPUs (generated kernels over CUDA IPC
// or peer access, with NCCL as the fallback the spec's selection rules name)
// or on CPUs (the host backend over shared memory), behind one API.
//
// Every rank of a group creates its Communicator with the same Library, group
// name and world size, and then issues the same collectives in the same
// order. Any decision that could differ between ranks (the topology, the
// staging size, whether NCCL is available) is agreed through the Store in
// New, so every rank takes the same path for every call.
package comm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/host"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// Host is the Config.Device value that selects the host (CPU) backend.
const Host = -1

// NCCL is the algorithm name that hands a collective to NCCL.
const NCCL = "nccl"

// DefaultTimeout bounds each barrier inside a kernel, and each host wait.
const DefaultTimeout = 10 * time.Second

// Config describes one rank's membership of a group.
type Config struct {
	// Rank and WorldSize: this rank's index and the number of ranks.
	Rank, WorldSize int
	// Device is the CUDA device ordinal of this rank, or Host.
	Device int
	// Store is the rendezvous store every rank of the group shares.
	Store rendezvous.Store
	// Library is the generated package's kernel library, e.g.
	// collectives.Library.
	Library *kernels.Library
	// Group names the group; groups sharing a Store need distinct names.
	// Default "default".
	Group string
	// Topology is the spec topology whose kernels and selection rules to
	// use; "" picks the first GPU topology (nvlink_full preferred) that
	// lists WorldSize, or the host_shm topology for Device: Host.
	Topology string
	// Timeout bounds every wait of a rank for a peer; a kernel that waits
	// longer reports a timeout instead of hanging. Default DefaultTimeout.
	Timeout time.Duration
	// StagingBytes sizes the registered staging buffer (GPU): each stage
	// slot holds one area per kernel protocol (barrier, ll, ll128), and
	// StagingBytes sets every area. 0 sizes each area for the largest
	// message the topology's rules send to a kernel of its protocol (an LL
	// inbox takes 2W times the message, an LL128 inbox about 1.07W times).
	StagingBytes int64
	// DisableNCCL keeps NCCL unloaded; sizes the rules give to NCCL then
	// fail with an error saying so.
	DisableNCCL bool
	// FatbinPath loads kernels from a fatbin built by `make fatbin` instead
	// of compiling the embedded sources with NVRTC.
	FatbinPath string
	// Cache is the NVRTC cache; nil uses cuda.DefaultCache when a cache
	// directory can be found, and compiles without caching otherwise.
	Cache *cuda.Cache
	// HostShared selects POSIX shared memory for Device: Host (ranks are
	// processes); false means ranks are goroutines of one process.
	HostShared bool
}

// Buffer is a collective's input or output: device memory on the GPU
// backend, a byte slice on the host backend.
type Buffer struct {
	dev  cuda.DevicePtr
	host []byte
}

// DeviceBuffer wraps a device address.
func DeviceBuffer(p cuda.DevicePtr) Buffer { return Buffer{dev: p} }

// HostBuffer wraps host memory.
func HostBuffer(b []byte) Buffer { return Buffer{host: b} }

// Options tune one call.
type Options struct {
	// Stream orders the collective on the GPU; nil uses the communicator's
	// own stream (and the call then waits for completion).
	Stream *cuda.Stream
	// Algorithm forces "oneshot", "twoshot", "hcm" or "nccl"; "" selects
	// by size with the spec's rules. A forced algorithm that cannot run is
	// an error, never silently replaced.
	Algorithm string
	// Tag identifies a host collective across ranks (see host.Options).
	Tag uint64
	// Context bounds host-side waits; nil means context.Background.
	Context context.Context
}

func (o Options) ctx() context.Context {
	if o.Context != nil {
		return o.Context
	}
	return context.Background()
}

// backend is what the GPU and host communicators implement.
type backend interface {
	allReduce(in, out Buffer, count int, dtype, op string, o Options) error
	reduceScatter(in, out Buffer, recvCount int, dtype, op string, o Options) error
	allGather(in, out Buffer, sendCount int, dtype string, o Options) error
	choose(collective coll.Collective, bytes int64, dtype coll.DType, op coll.Op) (coll.Algorithm, error)
	close() error
}

// Communicator is one rank's handle on a group.
type Communicator struct {
	cfg Config
	b   backend
	gpu *gpuComm // nil on the host backend
}

// New joins the group described by cfg. It is collective: every rank must
// call it (goroutine ranks concurrently).
func New(ctx context.Context, cfg Config) (*Communicator, error) {
	if cfg.WorldSize < 1 {
		return nil, fmt.Errorf("comm: world size %d must be at least 1", cfg.WorldSize)
	}
	if cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize {
		return nil, fmt.Errorf("comm: rank %d out of range for world size %d", cfg.Rank, cfg.WorldSize)
	}
	if cfg.Store == nil {
		return nil, errors.New("comm: Config.Store is nil; ranks need a rendezvous store (rendezvous.NewMemStore for goroutine ranks)")
	}
	if cfg.Library == nil {
		return nil, errors.New("comm: Config.Library is nil; pass your generated package's Library")
	}
	if cfg.Group == "" {
		cfg.Group = "default"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	c := &Communicator{cfg: cfg}
	if cfg.Device == Host {
		g, err := host.New(ctx, host.Config{Rank: cfg.Rank, World: cfg.WorldSize, Store: cfg.Store,
			Group: cfg.Group, Library: cfg.Library, Shared: cfg.HostShared, Timeout: cfg.Timeout})
		if err != nil {
			return nil, err
		}
		c.b = &hostComm{g: g}
		return c, nil
	}
	g, err := newGPU(ctx, cfg)
	if err != nil {
		return nil, err
	}
	c.b, c.gpu = g, g
	return c, nil
}

// Rank returns this rank's index.
func (c *Communicator) Rank() int { return c.cfg.Rank }

// WorldSize returns the number of ranks.
func (c *Communicator) WorldSize() int { return c.cfg.WorldSize }

// AllReduce combines count elements of every rank's in with op and writes
// the result to every rank's out. in and out may be the same buffer.
func (c *Communicator) AllReduce(in, out Buffer, count int, dtype, op string, o Options) error {
	return c.b.allReduce(in, out, count, dtype, op, o)
}

// ReduceScatter combines every rank's in (WorldSize*recvCount elements) with
// op; rank r receives elements [r*recvCount, (r+1)*recvCount) in out. For
// in-place use pass out = in + r*recvCount elements.
func (c *Communicator) ReduceScatter(in, out Buffer, recvCount int, dtype, op string, o Options) error {
	return c.b.reduceScatter(in, out, recvCount, dtype, op, o)
}

// AllGather concatenates every rank's in (sendCount elements) in rank order
// into every rank's out (WorldSize*sendCount elements). For in-place use
// pass in = out + r*sendCount elements.
func (c *Communicator) AllGather(in, out Buffer, sendCount int, dtype string, o Options) error {
	return c.b.allGather(in, out, sendCount, dtype, o)
}

// Choose returns the algorithm automatic selection picks for a message of
// the given size in bytes (for all-gather and reduce-scatter: the full,
// gathered size), or an error if nothing can run it.
func (c *Communicator) Choose(collective string, bytes int64, dtype, op string) (string, error) {
	alg, err := c.b.choose(coll.Collective(collective), bytes, coll.DType(dtype), coll.Op(op))
	return string(alg), err
}

// Alloc returns a symmetric device buffer of the given size: every rank
// allocates one in the same call (it is collective), and all-reduce and
// reduce-scatter calls whose input lies in such a buffer read it in place
// instead of copying it into the staging buffer (zero-copy). The choice is
// made per call from the input address and is not agreed through the store,
// so every rank must pass a symmetric input (at the same offset) in the
// same calls: a call where some ranks do and others do not runs kernels
// with different barrier counts, which then report a TimeoutError. Freed by
// Close. GPU only.
func (c *Communicator) Alloc(ctx context.Context, bytes int) (cuda.DevicePtr, error) {
	if c.gpu == nil {
		return 0, errors.New("comm: Alloc is for GPU communicators; host buffers are plain []byte")
	}
	return c.gpu.alloc(ctx, bytes)
}

// Synchronize waits for the stream (nil: the communicator's own) and then
// returns any error a kernel reported, such as a timeout waiting for a peer.
func (c *Communicator) Synchronize(s *cuda.Stream) error {
	if c.gpu == nil {
		return nil
	}
	return c.gpu.synchronize(s)
}

// Err returns the first error a kernel reported without waiting, or nil.
func (c *Communicator) Err() error {
	if c.gpu == nil {
		return nil
	}
	return c.gpu.statusErr()
}

// Device returns the CUDA device of a GPU communicator, nil on the host.
func (c *Communicator) Device() *cuda.Device {
	if c.gpu == nil {
		return nil
	}
	return c.gpu.dev
}

// Stream returns the GPU communicator's own stream, nil on the host.
func (c *Communicator) Stream() *cuda.Stream {
	if c.gpu == nil {
		return nil
	}
	return c.gpu.stream
}

// Close releases everything the communicator owns (IPC mappings, staging
// and symmetric buffers, the NCCL communicator, shared memory). It is
// collective on the GPU: ranks wait for each other before freeing memory
// peers may still map.
func (c *Communicator) Close() error { return c.b.close() }

// hostComm adapts host.Group to the backend interface.
type hostComm struct{ g *host.Group }

func (h *hostComm) allReduce(in, out Buffer, count int, dtype, op string, o Options) error {
	return h.g.AllReduce(o.ctx(), in.host, out.host, count, dtype, op, host.Options{Algorithm: o.Algorithm, Tag: o.Tag})
}

func (h *hostComm) reduceScatter(in, out Buffer, recvCount int, dtype, op string, o Options) error {
	return h.g.ReduceScatter(o.ctx(), in.host, out.host, recvCount, dtype, op, host.Options{Algorithm: o.Algorithm, Tag: o.Tag})
}

func (h *hostComm) allGather(in, out Buffer, sendCount int, dtype string, o Options) error {
	return h.g.AllGather(o.ctx(), in.host, out.host, sendCount, dtype, host.Options{Algorithm: o.Algorithm, Tag: o.Tag})
}

func (h *hostComm) choose(collective coll.Collective, bytes int64, dtype coll.DType, op coll.Op) (coll.Algorithm, error) {
	return coll.Algorithm(h.g.Algorithm(string(collective), bytes)), nil
}

func (h *hostComm) close() error { return h.g.Close() }
