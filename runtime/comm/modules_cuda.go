//go:build cgo && linux && (amd64 || arm64)

package comm

// Kernel loading on a cudaDevice: the fatbin, NVRTC builds through the
// cache, lazy lookups, and the process's module share (modshare.go) that
// lets communicators on one GPU hold one copy of each module.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
)

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

// preload readies every kernel of ks (see device.preload): without a
// fatbin it first builds the sources they need with NVRTC in parallel
// through the cache (cuda.Builder: ranks of one host compile each program
// once between them; kernels sharing a program compile it once) and loads
// them; then function looks every kernel up, in the fatbin or in those
// modules; then, where ranks share the context (shareContext), its
// local memory is grown for the kernel that uses the most. A first launch
// needing more would grow it itself, and that growth waits for every
// kernel of the context: there, for peers' kernels waiting for the very
// kernel behind it, until Config.Timeout (case 99). Here, in New, none of
// the group's kernels runs yet (a rank leaves New only after every rank's
// preload). With a context of its own a rank lets its first launch grow
// it, as a group that never launches such a kernel then costs nothing.
func (d *cudaDevice) preload(ctx context.Context, ks []*kernels.Kernel, ids []int) error {
	if d.fatbin == nil {
		if err := d.build(ctx, ks); err != nil {
			return err
		}
	}
	need, most := 0, ""
	for i, k := range ks {
		f, err := d.function(k, ids[i])
		if err != nil {
			return err
		}
		if !d.sharing {
			continue
		}
		n, err := f.LocalBytes()
		if err != nil {
			return &KernelError{Kernel: k.Name, Err: err}
		}
		if n > need {
			need, most = n, k.Name
		}
	}
	if need == 0 {
		return nil
	}
	if err := d.dev.ReserveStack(need); err != nil {
		return fmt.Errorf("reserve the %d bytes of local memory a thread that kernel %s uses: %w", need, most, err)
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
		if m == d.fatbin {
			// A fatbin built from another generated library (older, or
			// of another spec) lacks this kernel's function.
			err = fmt.Errorf("%w; the fatbin (%s) lacks %s: rebuild it from this library (collgen fatbin, docs/cold-start.md) or unset Config.FatbinPath and $COLLGEN_FATBIN", err, m.Origin, k.Func())
		}
		return nil, &KernelError{Kernel: k.Name, Err: err}
	}
	d.fns[id].Store(f)
	return f, nil
}
