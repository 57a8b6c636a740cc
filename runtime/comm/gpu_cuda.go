//go:build cgo && linux && (amd64 || arm64)

package comm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/ipc"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/nccl"
	"github.com/collgen/collgen/runtime/symm"
)

// cudaDevice is the device over runtime/cuda, runtime/ipc, runtime/nccl
// and runtime/symm. It owns, and release frees in reverse order of
// creation: the NCCL communicator, the symmetric-memory pool (its buffers
// and mappings) and its backend, the region's mapping, the region, the
// sequence counters, the status word, loaded modules, the fatbin, the
// stream and the device's context. Pools given to UseSymmetric stay the
// caller's.
type cudaDevice struct {
	cfg    Config
	dev    *cuda.Device // nil once released
	handle *cuda.Device // dev, kept after release for Communicator.Device
	own    *cuda.Stream
	fatbin *cuda.Module
	comm   *nccl.Comm

	region    cuda.DevicePtr
	regionMap *ipc.Mapping
	seq       cuda.DevicePtr
	statusBuf *cuda.HostBuffer
	// sharing: another rank of this process shares the GPU's context
	// (shareContext); release then lets gpuGate park its frees.
	sharing bool

	// fns holds each loaded kernel by its index in Config.Library.Kernels,
	// so launch finds it without a lock or a lookup by name. A slot is
	// written only under mu, from nil to a function of a module the
	// device keeps loaded (preload in New, before any call; function on a
	// lazy miss), and emptied only by release, which runs once every call
	// has ended (Close and Abort wait for busy). A reader that loads nil
	// takes the slow path (function), which looks again under mu.
	fns []atomic.Pointer[cuda.Function]

	mu sync.Mutex // guards modules, pool, symmBE and writes to fns
	// modules are the NVRTC-built modules by Kernel.Source: kernels that
	// share a program (Kernel.Symbol) share its module. They and fatbin
	// belong to the process's module share (procModules); held are the
	// keys this device holds a reference to, dropped at release.
	modules map[string]*cuda.Module
	held    []moduleKey
	pool    *symm.Pool // Alloc's, made on first use
	symmBE  *symm.CUDABackend

	// pools are the symmetric-memory pools whose buffers are read in
	// place: pool and those given to UseSymmetric. Written under mu by
	// copy-and-swap, read without a lock on every call (lookup).
	pools atomic.Pointer[[]*symm.Pool]

	abortState // device_abort.go: Abort, bounded waits
}

// openDevice opens Config.Device, its stream and the fatbin, if any.
func openDevice(cfg Config) (device, error) {
	dev, own, err := openGPU(cfg, "; for CPU ranks set Config.Device = comm.Host")
	if err != nil {
		return nil, err
	}
	d := &cudaDevice{cfg: cfg, dev: dev, handle: dev, own: own}
	gpuGate.open(dev.Ordinal) // closed by releaseMost, with d.dev
	if cfg.Library != nil {
		d.fns = make([]atomic.Pointer[cuda.Function], len(cfg.Library.Kernels))
	}
	if d.fatbin, err = d.loadFatbin(); err != nil {
		return nil, errors.Join(err, d.release())
	}
	return d, nil
}

func (d *cudaDevice) ncclUnavailable() string {
	if _, err := nccl.Load(); err != nil {
		return err.Error()
	}
	return ""
}

// openNCCL makes the NCCL communicator: blocking (ncclCommInitRank) by
// default, non-blocking with Config.NCCLNonBlocking (its initialisation
// bounded by ctx and every later NCCL operation by Config.Timeout).
func (d *cudaDevice) openNCCL(ctx context.Context, key string, rank, world int) (err error) {
	if d.comm, err = newNCCL(ctx, d.cfg, key, rank, world, d.dev); err != nil {
		return err
	}
	d.watch = &ncclWatch{asyncErr: d.comm.AsyncError, abort: func() { d.comm.Abort() }, timeout: d.cfg.Timeout, what: "an NCCL collective"}
	return nil
}

// newNCCL makes one NCCL communicator of cfg's group on dev, blocking or
// non-blocking as Config.NCCLNonBlocking says.
func newNCCL(ctx context.Context, cfg Config, key string, rank, world int, dev *cuda.Device) (*nccl.Comm, error) {
	if cfg.NCCLNonBlocking {
		return nccl.NewCommConfig(ctx, cfg.Store, key, rank, world, dev, nccl.Config{Timeout: cfg.Timeout})
	}
	return nccl.NewComm(ctx, cfg.Store, key, rank, world, dev)
}

func (d *cudaDevice) setup(ctx context.Context, key string, regionBytes, seqBytes int64) ([]cuda.DevicePtr, cuda.DevicePtr, cuda.DevicePtr, error) {
	var err error
	if d.region, err = d.dev.Alloc(int(regionBytes)); err != nil {
		return nil, 0, 0, err
	}
	if err := d.dev.Memset8(d.region, 0, int(regionBytes)); err != nil {
		return nil, 0, 0, err
	}
	if d.seq, err = d.dev.Alloc(int(seqBytes)); err != nil {
		return nil, 0, 0, err
	}
	if err := d.dev.Memset8(d.seq, 0, int(seqBytes)); err != nil {
		return nil, 0, 0, err
	}
	if err := d.prepareAbort(); err != nil {
		return nil, 0, 0, err
	}
	if d.statusBuf, err = d.dev.HostAlloc(8, true); err != nil {
		return nil, 0, 0, err
	}
	if d.regionMap, err = ipc.Exchange(ctx, d.cfg.Store, key, d.cfg.Rank, d.cfg.WorldSize, d.dev, d.region, int(regionBytes)); err != nil {
		return nil, 0, 0, err
	}
	return d.regionMap.Peers(), d.seq, d.statusBuf.DevPtr, nil
}

func (d *cudaDevice) symmetric(ctx context.Context, group string, bytes int) (cuda.DevicePtr, error) {
	pool, err := d.ownPool(ctx, group)
	if err != nil {
		return 0, err
	}
	b, err := pool.Alloc(bytes)
	if err != nil {
		return 0, err
	}
	if _, err := pool.Rendezvous(ctx, b); err != nil {
		return 0, errors.Join(err, b.Free())
	}
	return cuda.DevicePtr(b.Addr()), nil
}

// ownPool returns the pool behind Alloc, forming it (collectively: every
// rank's first Alloc) on first use.
func (d *cudaDevice) ownPool(ctx context.Context, group string) (*symm.Pool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pool != nil {
		return d.pool, nil
	}
	be, err := symm.NewCUDABackend(d.dev, d.cfg.Cache)
	if err != nil {
		return nil, err
	}
	pool, err := symm.NewPool(ctx, symm.Config{Group: group, Rank: d.cfg.Rank, WorldSize: d.cfg.WorldSize,
		Device: d.cfg.Device, Store: d.cfg.Store, Backend: be, Timeout: d.cfg.Timeout})
	if err != nil {
		return nil, errors.Join(err, be.Close())
	}
	d.pool, d.symmBE = pool, be
	d.addPool(pool)
	return pool, nil
}

// addPool makes pool's buffers candidates for zero-copy. Callers hold mu.
func (d *cudaDevice) addPool(pool *symm.Pool) {
	var next []*symm.Pool
	if old := d.pools.Load(); old != nil {
		next = append(next, *old...)
	}
	next = append(next, pool)
	d.pools.Store(&next)
}

// checkSymmetric checks that pool's buffers live on this rank's GPU.
func (d *cudaDevice) checkSymmetric(pool *symm.Pool) error {
	be, ok := pool.Backend().(*symm.CUDABackend)
	if !ok {
		return errorf(ErrInvalidArgument, "comm: UseSymmetric: pool of group %q uses the %q backend; a GPU communicator reads only CUDA symmetric memory in place", pool.Group(), pool.Backend().Kind())
	}
	if be.Device().Ordinal != d.handle.Ordinal {
		return errorf(ErrInvalidArgument, "comm: UseSymmetric: pool of group %q allocates on GPU %d, this rank's communicator runs on GPU %d", pool.Group(), be.Device().Ordinal, d.handle.Ordinal)
	}
	return nil
}

// addSymmetric adds pool to the zero-copy candidates, once.
func (d *cudaDevice) addSymmetric(pool *symm.Pool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if old := d.pools.Load(); old == nil || !slices.Contains(*old, pool) {
		d.addPool(pool)
	}
}

func (d *cudaDevice) lookup(p cuda.DevicePtr, n int64) (zeroCopy, bool) {
	pools := d.pools.Load()
	if pools == nil {
		return zeroCopy{}, false
	}
	b, off, ok := symm.Lookup(uintptr(p))
	// n is the call's input bytes, any int64 the front end's overflow
	// check lets through (a DeviceBuffer has no length): compared as
	// off+n, a count near 2^63 wrapped negative and counted as inside.
	if !ok || n > int64(b.Size())-int64(off) || !slices.Contains(*pools, b.Pool()) {
		return zeroCopy{}, false
	}
	h := b.Handle()
	if h == nil { // not rendezvoused: peers cannot see it
		return zeroCopy{}, false
	}
	return zeroCopy{offset: int64(off), peers: h}, true
}

func (d *cudaDevice) earlyLaunch() bool { return d.dev.EarlyLaunch() }

func (d *cudaDevice) smCount() int { return d.dev.SMCount }

// workQueues implements device.
func (d *cudaDevice) workQueues() int { return cuda.WorkQueues() }

func (d *cudaDevice) launch(k *kernels.Kernel, id int, grid, block uint32, args []byte, s *cuda.Stream, early bool) error {
	var f *cuda.Function
	if id >= 0 && id < len(d.fns) {
		f = d.fns[id].Load()
	}
	if f == nil {
		var err error
		if f, err = d.function(k, id); err != nil {
			return err
		}
	}
	if s == nil {
		s = d.own
	}
	if early {
		return f.LaunchEarly([3]uint32{grid, 1, 1}, [3]uint32{block, 1, 1}, 0, s, args)
	}
	return f.Launch([3]uint32{grid, 1, 1}, [3]uint32{block, 1, 1}, 0, s, args)
}

func (d *cudaDevice) runNCCL(cl *call, s *cuda.Stream) error {
	if s == nil {
		s = d.own
	}
	d.ncclPending.note(s) // a wait on s is bounded now: NCCL kernels have no deadline
	return ncclCall(d.comm, cl.collective, cl.in.dev, cl.out.dev, cl.count, cl.dtype, cl.op, s)
}

func (d *cudaDevice) copy(dst, src cuda.DevicePtr, bytes int64, s *cuda.Stream) error {
	if s == nil {
		s = d.own
	}
	return d.dev.CopyDtoDAsync(dst, src, int(bytes), s)
}

func (d *cudaDevice) synchronize(s *cuda.Stream) error {
	if s == nil {
		s = d.own
	}
	if s == nil {
		return nil
	}
	return d.wait(s)
}

func (d *cudaDevice) ncclError() error {
	if d.comm == nil {
		return nil
	}
	return d.comm.AsyncError()
}

func (d *cudaDevice) status() uint64 {
	if d.statusBuf == nil {
		return 0
	}
	lo := d.statusBuf.LoadUint32(0)
	if lo == 0 {
		return 0
	}
	return uint64(d.statusBuf.LoadUint32(4))<<32 | uint64(lo)
}

func (d *cudaDevice) cudaDevice() *cuda.Device { return d.handle }

func (d *cudaDevice) stream() *cuda.Stream { return d.own }

func (d *cudaDevice) release() error {
	w, err := d.releaseMost()
	switch {
	case w == nil:
		return err
	case w.park:
		// No caller is left to see the parked free's error: the memory goes
		// with the process at worst.
		go gpuGate.free(w.ordinal, w.all)
		return err
	}
	return errors.Join(err, w.all())
}

// releaseKeepingRegion implements aborter: release, but the staging
// region and the device (the context it lives in) stay until the returned
// function frees them, through gpuGate.free; where the gate parks the
// frees (ranks of the process share the GPU), all that waits for the
// context's kernels goes with them. Nil without a region.
func (d *cudaDevice) releaseKeepingRegion() (func() error, error) {
	w, err := d.releaseMost()
	switch {
	case w == nil:
		return nil, err
	case w.park:
		return func() error { return gpuGate.free(w.ordinal, w.all) }, err
	case !w.hasRegion:
		return nil, errors.Join(err, w.all())
	}
	err = errors.Join(err, w.others())
	return func() error { return gpuGate.free(w.ordinal, w.regionAndDevice) }, err
}

// waitingFrees are a released device's frees that may wait for every
// kernel of its CUDA context (cuMemFree, cuMemFreeHost, cuModuleUnload:
// tests/gpu/free_probe.cu), in two parts: the context and the staging
// region peers' kernels read (freed last), and the rest; with what
// gpuGate.close said of them.
type waitingFrees struct {
	ordinal                 int
	park                    bool // run them through gpuGate.free
	hasRegion               bool
	others, regionAndDevice func() error
}

// all runs both parts, the region and the context last.
func (w *waitingFrees) all() error { return errors.Join(w.others(), w.regionAndDevice()) }

// shareContext marks the device as sharing its CUDA context with another
// rank of this process (gpuGate.share); New calls it once, after the
// ranks' agreement, before any kernel runs.
func (d *cudaDevice) shareContext() {
	if !d.sharing && d.dev != nil {
		d.sharing = true
		gpuGate.share(d.dev.Ordinal)
	}
}

// releaseMost frees at once what never waits for the context's kernels
// (streams, the NCCL communicator, the peers' mapped regions) and counts
// the communicator off the GPU (gpuGate.close, which says whether the
// rest must park). It returns the rest for the caller to run or park; nil
// when the device holds no context.
func (d *cudaDevice) releaseMost() (*waitingFrees, error) {
	d.relMu.Lock() // not while releaseKernels works on the device
	defer d.relMu.Unlock()
	var errs []error
	if d.abortStream != nil {
		errs = append(errs, d.abortStream.Destroy())
		d.abortStream = nil
	}
	if d.comm != nil {
		errs = append(errs, d.comm.Close())
		d.comm, d.watch = nil, nil
	}
	d.pools.Store(nil)
	if d.regionMap != nil {
		errs = append(errs, d.regionMap.Close()) // this rank's imports of its peers' regions
		d.regionMap = nil
	}
	if d.own != nil {
		errs = append(errs, d.own.Destroy())
		d.own = nil
	}
	for i := range d.fns {
		d.fns[i].Store(nil)
	}
	dev := d.dev
	d.dev = nil
	if dev == nil {
		return nil, collapseDriverErrors(errs)
	}
	// This communicator is live no more.
	w := &waitingFrees{ordinal: dev.Ordinal, park: gpuGate.close(dev.Ordinal, d.sharing)}
	pool, symmBE, seq, status, held, region := d.pool, d.symmBE, d.seq, d.statusBuf, d.held, d.region
	d.pool, d.symmBE, d.seq, d.statusBuf, d.held, d.modules, d.fatbin, d.region = nil, nil, 0, nil, nil, nil, nil, 0
	w.others = func() error {
		var errs []error
		if pool != nil {
			errs = append(errs, pool.Close(), symmBE.Close())
		}
		errs = append(errs, dev.Free(seq))
		if status != nil {
			errs = append(errs, status.Free())
		}
		for _, k := range held { // unloaded by the last communicator holding them
			if m, last := procModules.drop(k); last {
				errs = append(errs, m.Unload())
			}
		}
		return collapseDriverErrors(errs)
	}
	w.hasRegion = region != 0
	w.regionAndDevice = func() error {
		return collapseDriverErrors([]error{dev.Free(region), dev.Close()})
	}
	return w, collapseDriverErrors(errs)
}

// collapseDriverErrors joins errs, keeping each CUDA result's first error
// whole and counting the rest: after a kernel fault the context's error
// is sticky, and every cleanup call (one per loaded module, buffer and
// stream) fails with it.
func collapseDriverErrors(errs []error) error {
	var out []error
	first := map[string]int{} // result name -> index in out
	more := map[string]int{}
	for _, err := range errs {
		var ce *cuda.Error
		if err == nil {
			continue
		}
		if !errors.As(err, &ce) {
			out = append(out, err)
			continue
		}
		if _, seen := first[ce.Name]; seen {
			more[ce.Name]++
			continue
		}
		first[ce.Name] = len(out)
		out = append(out, err)
	}
	for name, n := range more {
		i := first[name]
		out[i] = fmt.Errorf("%w (and %d more clean-up calls failed with %s: the CUDA context has faulted, and its resources go with the process)", out[i], n, name)
	}
	return errors.Join(out...)
}
