//go:build cgo && linux && (amd64 || arm64)

package comm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

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

// loadFatbin loads Config.Fatbin, else the file Config.FatbinPath or
// $COLLGEN_FATBIN names, through the process's module share (a fatbin
// another communicator on this GPU loaded is taken, not loaded again);
// nil when none is set (kernels come from NVRTC). A named fatbin is used
// or New fails; there is no fallback to NVRTC.
func (d *cudaDevice) loadFatbin() (*cuda.Module, error) {
	cfg := d.cfg
	path := cfg.FatbinPath
	if path == "" {
		path = os.Getenv(EnvFatbin)
	}
	var id string
	var load func() (*cuda.Module, error)
	switch {
	case len(cfg.Fatbin) > 0:
		path = "embedded"
		// The image's own bytes name it: a program passes the same
		// (embedded) slice to every communicator.
		id = fmt.Sprintf("fatbin bytes %p %d", unsafe.SliceData(cfg.Fatbin), len(cfg.Fatbin))
		load = func() (*cuda.Module, error) { return d.dev.LoadFatbin(cfg.Fatbin, path) }
	case path != "":
		id = "fatbin file " + path
		if abs, err := filepath.Abs(path); err == nil {
			id = "fatbin file " + abs
		}
		if st, err := os.Stat(path); err == nil { // a file rewritten since is another fatbin
			id += fmt.Sprintf(" %d %d", st.Size(), st.ModTime().UnixNano())
		}
		load = func() (*cuda.Module, error) { return d.dev.LoadFatbinFile(path) }
	default:
		return nil, nil
	}
	key := moduleKey{d.dev.Ordinal, id}
	m, err := d.shareModule(context.Background(), key, load)
	if err != nil {
		return nil, fatbinError(cfg.Rank, path, err)
	}
	d.held = append(d.held, key)
	return m, nil
}

// procModules is the process's module share (modshare.go).
var procModules = newModuleShare[*cuda.Module]()

// shareModule returns key's module, loading it with load where no
// communicator of the process holds it, else waiting for its loader. The
// caller records key in d.held (keep), or drops it.
func (d *cudaDevice) shareModule(ctx context.Context, key moduleKey, load func() (*cuda.Module, error)) (*cuda.Module, error) {
	e, mine := procModules.claim(key)
	if !mine {
		return procModules.wait(ctx, key, e)
	}
	m, err := load()
	procModules.fill(key, e, m, err)
	return m, err
}

// moduleID names the module NVRTC builds from source with opts for this
// device's library. The library's address names it: a holder's Config
// keeps the library alive, so no other takes its address while the
// share's entry lives (so too a fatbin slice's, in loadFatbin).
func (d *cudaDevice) moduleID(source string, opts []string) string {
	return fmt.Sprintf("nvrtc %p %s %q", d.cfg.Library, source, opts)
}

// keep records m, shared under key, as source's module; d.mu held. A
// source already kept (a lazy load that ran while preload built) keeps
// its module, and this reference is dropped (never the last: d holds one).
func (d *cudaDevice) keep(source string, key moduleKey, m *cuda.Module) {
	if d.modules[source] != nil {
		procModules.drop(key)
		return
	}
	if d.modules == nil {
		d.modules = map[string]*cuda.Module{}
	}
	d.modules[source] = m
	d.held = append(d.held, key)
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
	if d.cfg.NCCLNonBlocking {
		d.comm, err = nccl.NewCommConfig(ctx, d.cfg.Store, key, rank, world, d.dev, nccl.Config{Timeout: d.cfg.Timeout})
	} else {
		d.comm, err = nccl.NewComm(ctx, d.cfg.Store, key, rank, world, d.dev)
	}
	return err
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
	if !ok || int64(off)+n > int64(b.Size()) || !slices.Contains(*pools, b.Pool()) {
		return zeroCopy{}, false
	}
	h := b.Handle()
	if h == nil { // not rendezvoused: peers cannot see it
		return zeroCopy{}, false
	}
	return zeroCopy{offset: int64(off), peers: h}, true
}

// preload readies every kernel of ks (see device.preload): without a
// fatbin it first builds the sources they need with NVRTC in parallel
// through the cache (cuda.Builder: ranks of one host compile each program
// once between them; kernels sharing a program compile it once) and loads
// them; then function looks every kernel up, in the fatbin or in those
// modules.
func (d *cudaDevice) preload(ctx context.Context, ks []*kernels.Kernel, ids []int) error {
	if d.fatbin == nil {
		if err := d.build(ctx, ks); err != nil {
			return err
		}
	}
	for i, k := range ks {
		if _, err := d.function(k, ids[i]); err != nil {
			return err
		}
	}
	return nil
}

// build compiles (or reads from the cache) and loads the sources of ks
// that no module of the device holds yet, in parallel, taking those
// another communicator of the process has loaded on this GPU from the
// module share instead.
func (d *cudaDevice) build(ctx context.Context, ks []*kernels.Kernel) error {
	type need struct {
		k    *kernels.Kernel // the first kernel of the source, for errors
		req  cuda.CompileRequest
		key  moduleKey
		e    *sharedModule[*cuda.Module]
		mine bool // this device loads it (else another communicator does)
	}
	var needs []need
	seen := map[string]bool{}
	headers, err := d.cfg.Library.Headers()
	opts := nvrtcOptions()
	d.mu.Lock()
	for _, k := range ks {
		if seen[k.Source] || d.modules[k.Source] != nil {
			continue
		}
		seen[k.Source] = true
		var req cuda.CompileRequest
		if err == nil {
			req, err = d.request(k, headers, opts)
		}
		if err != nil {
			d.mu.Unlock()
			return &KernelError{Kernel: k.Name, Err: errorf(ErrInvalidArgument, "%w", err)}
		}
		needs = append(needs, need{k: k, req: req, key: moduleKey{d.dev.Ordinal, d.moduleID(k.Source, opts)}})
	}
	d.mu.Unlock()
	var load []int // indexes into needs of the modules this device loads
	var reqs []cuda.CompileRequest
	for i := range needs {
		if needs[i].e, needs[i].mine = procModules.claim(needs[i].key); needs[i].mine {
			load, reqs = append(load, i), append(reqs, needs[i].req)
		}
	}
	mods := make([]*cuda.Module, len(needs))
	var errs []error
	if len(reqs) > 0 {
		b := &cuda.Builder{Cache: d.cache(), Start: d.cfg.Rank * len(reqs) / max(d.cfg.WorldSize, 1)}
		loaded, err := d.dev.LoadSources(ctx, reqs, b)
		if err != nil {
			var be *cuda.BuildError
			if errors.As(err, &be) && be.Index >= 0 && be.Index < len(load) {
				err = &KernelError{Kernel: needs[load[be.Index]].k.Name, Err: be.Err}
			}
			errs = append(errs, err) // else the context ended
		}
		for j, i := range load {
			if err != nil {
				procModules.fill(needs[i].key, needs[i].e, nil, err)
				continue
			}
			mods[i] = loaded[j]
			procModules.fill(needs[i].key, needs[i].e, loaded[j], nil)
		}
	}
	for i, n := range needs {
		if n.mine {
			continue
		}
		m, err := procModules.wait(ctx, n.key, n.e)
		if err != nil {
			errs = append(errs, &KernelError{Kernel: n.k.Name, Err: err})
			continue
		}
		mods[i] = m
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, n := range needs {
		if mods[i] == nil {
			continue
		}
		if len(errs) > 0 { // New fails: hand back what this device took
			if m, last := procModules.drop(n.key); last {
				errs = append(errs, m.Unload())
			}
			continue
		}
		d.keep(n.k.Source, n.key, mods[i])
	}
	return errors.Join(errs...)
}

// cache is Config.Cache, else the default cache (nil when there is no
// cache directory: everything is compiled).
func (d *cudaDevice) cache() *cuda.Cache {
	if d.cfg.Cache != nil {
		return d.cfg.Cache
	}
	c, _ := cuda.DefaultCache()
	return c
}

// request is kernel k's NVRTC compile request, with the library's
// headers and the options nvrtcOptions gives.
func (d *cudaDevice) request(k *kernels.Kernel, headers map[string]string, opts []string) (cuda.CompileRequest, error) {
	src, err := d.cfg.Library.Source(k.Source)
	if err != nil {
		return cuda.CompileRequest{}, err
	}
	return cuda.CompileRequest{Name: k.Source, Source: src, Headers: headers, Options: opts}, nil
}

// nvrtcOptions are the NVRTC options of every generated kernel:
// --std=c++17; -minimal where NVRTC has it (12.4 and later); then
// $COLLGEN_NVRTC_OPTIONS (space separated, unset by default), which lets
// an option be measured on the communicator itself (cold start, proof,
// bench) before it is adopted here (docs/cold-start.md). Options are part
// of the cache key, so images compiled with other options are never loaded
// in their place.
//
// -minimal leaves out of each program what the generated kernels never
// use (texture and surface types, device-side runtime calls and launches,
// the runtime's types): on 2 x H200 with NVRTC 13.0 an empty program with
// the headers took 11 ms instead of 31, and every one of the 393 kernels
// of the shipped spec compiled to the same image with and without it
// (TestNVRTCOptionsSameCode).
func nvrtcOptions() []string {
	major, minor, _, err := cuda.NVRTCVersion()
	if err != nil {
		major, minor = 0, 0 // no NVRTC: the compile itself reports it
	}
	return nvrtcOptionsFor(major, minor, os.Getenv("COLLGEN_NVRTC_OPTIONS"))
}

// nvrtcOptionsFor is nvrtcOptions for NVRTC major.minor and the value of
// $COLLGEN_NVRTC_OPTIONS; an option given twice is kept once.
func nvrtcOptionsFor(major, minor int, env string) []string {
	opts := []string{"--std=c++17"}
	if major > 12 || major == 12 && minor >= 4 {
		opts = append(opts, "-minimal")
	}
	for _, o := range strings.Fields(env) {
		if !slices.Contains(opts, o) {
			opts = append(opts, o)
		}
	}
	return opts
}

// function returns kernel k, the id-th of the library, loading it if its
// slot is empty: from the fatbin, or (Config.LazyKernels) compiled or
// loaded from the cache now. launch calls it only on a miss.
func (d *cudaDevice) function(k *kernels.Kernel, id int) (*cuda.Function, error) {
	if id < 0 || id >= len(d.fns) {
		return nil, &KernelError{Kernel: k.Name, Err: errorf(ErrInvalidArgument, "comm: kernel %s has index %d, outside Config.Library's %d kernels", k.Name, id, len(d.fns))}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.fns[id].Load(); f != nil {
		return f, nil
	}
	m := d.fatbin
	if m == nil {
		m = d.modules[k.Source]
	}
	if m == nil {
		headers, err := d.cfg.Library.Headers()
		var req cuda.CompileRequest
		if err == nil {
			req, err = d.request(k, headers, nvrtcOptions())
		}
		if err != nil {
			return nil, &KernelError{Kernel: k.Name, Err: errorf(ErrInvalidArgument, "%w", err)}
		}
		key := moduleKey{d.dev.Ordinal, d.moduleID(k.Source, req.Options)}
		if m, err = d.shareModule(context.Background(), key, func() (*cuda.Module, error) {
			return d.dev.LoadSource(context.Background(), req, d.cache())
		}); err != nil {
			return nil, &KernelError{Kernel: k.Name, Err: err}
		}
		d.keep(k.Source, key, m)
	}
	f, err := m.Function(k.Func())
	if err != nil {
		return nil, &KernelError{Kernel: k.Name, Err: err}
	}
	d.fns[id].Store(f)
	return f, nil
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
	d.noteNCCL(s)
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
	all, _, park, ordinal, err := d.releaseMost()
	if all == nil {
		return err
	}
	if park {
		// No caller is left to see the parked free's error: the memory goes
		// with the process at worst.
		go gpuGate.free(ordinal, all)
		return err
	}
	return errors.Join(err, all())
}

// releaseKeepingRegion implements aborter: release, but the staging
// region and the device (the context it lives in) stay until the returned
// function frees them, through gpuGate.free; where the gate parks the
// frees (ranks of the process share the GPU), all that waits for the
// context's kernels goes with them. Nil without a region.
func (d *cudaDevice) releaseKeepingRegion() (func() error, error) {
	all, rest, park, ordinal, err := d.releaseMost()
	switch {
	case all == nil:
		return nil, err
	case !rest.hasRegion && !park:
		return nil, errors.Join(err, all())
	case !park:
		err = errors.Join(err, rest.others())
		return func() error { return gpuGate.free(ordinal, rest.regionAndDevice) }, err
	}
	return func() error { return gpuGate.free(ordinal, all) }, err
}

// waitingFrees are a released device's frees that may wait for every
// kernel of its CUDA context (cuMemFree, cuMemFreeHost, cuModuleUnload:
// tests/gpu/free_probe.cu), in two parts: the context and the staging
// region peers' kernels read (freed last), and the rest.
type waitingFrees struct {
	others, regionAndDevice func() error
	hasRegion               bool
}

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
// rest must park). It returns the rest, whole (all) and in parts (rest),
// for the caller to run or park; all is nil when the device holds no
// context.
func (d *cudaDevice) releaseMost() (all func() error, rest waitingFrees, park bool, ordinal int, err error) {
	d.relMu.Lock() // not while releaseKernels works on the device
	defer d.relMu.Unlock()
	var errs []error
	if d.abortStream != nil {
		errs = append(errs, d.abortStream.Destroy())
		d.abortStream = nil
	}
	if d.comm != nil {
		errs = append(errs, d.comm.Destroy())
		d.comm = nil
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
		return nil, rest, false, 0, collapseDriverErrors(errs)
	}
	ordinal = dev.Ordinal
	park = gpuGate.close(ordinal, d.sharing) // this communicator is live no more
	pool, symmBE, seq, status, held, region := d.pool, d.symmBE, d.seq, d.statusBuf, d.held, d.region
	d.pool, d.symmBE, d.seq, d.statusBuf, d.held, d.modules, d.fatbin, d.region = nil, nil, 0, nil, nil, nil, nil, 0
	rest.others = func() error {
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
	rest.hasRegion = region != 0
	rest.regionAndDevice = func() error {
		return collapseDriverErrors([]error{dev.Free(region), dev.Close()})
	}
	all = func() error { return errors.Join(rest.others(), rest.regionAndDevice()) }
	return all, rest, park, ordinal, collapseDriverErrors(errs)
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
