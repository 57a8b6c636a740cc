//go:build cgo

package cuda

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
)

// LoadSource compiles req for this device with NVRTC, through cache (nil:
// DefaultCache; a cache that cannot be used only costs a recompile), and
// loads the module. req.Arch 0 means this device's architecture. Like
// Builder, it takes the program's lock in the cache first, so the ranks of
// a host loading the same program (Config.LazyKernels) compile it once. A
// cached image the driver rejects is recompiled and replaced.
// Module.Origin says "nvrtc-cache" for a hit and "nvrtc" for a fresh
// compile.
func (d *Device) LoadSource(ctx context.Context, req CompileRequest, cache *Cache) (*Module, error) {
	if req.Arch == 0 {
		req.Arch = d.Arch()
	}
	if cache == nil {
		cache, _ = DefaultCache()
	}
	built, err := (&Builder{Cache: cache}).one(ctx, req, true)
	if err != nil {
		return nil, err
	}
	if built.Compiled {
		return d.loadModule(built.Image, "nvrtc")
	}
	if m, err := d.loadModule(built.Image, "nvrtc-cache"); err == nil {
		return m, nil
	}
	cache.corrupt.Add(1)
	img, err := Compile(ctx, req)
	if err != nil {
		return nil, err
	}
	m, err := d.loadModule(img, "nvrtc")
	if err != nil {
		return nil, err
	}
	if k, kerr := cache.Key(req); kerr == nil {
		_ = cache.Put(k, img) // best effort: a read-only cache only costs time
	}
	return m, nil
}

// LoadKernels loads src for this device as KernelSource describes.
func (d *Device) LoadKernels(ctx context.Context, src KernelSource, cache *Cache) (*Module, error) {
	var ferr error
	switch {
	case len(src.Fatbin) > 0:
		m, err := d.LoadFatbin(src.Fatbin, "embedded")
		if err == nil {
			return m, nil
		}
		ferr = err
	case src.FatbinPath != "":
		m, err := d.LoadFatbinFile(src.FatbinPath)
		if err == nil {
			return m, nil
		}
		ferr = err
	}
	if src.Source.Source == "" {
		if ferr == nil {
			ferr = fmt.Errorf("cuda: load kernels on device %d: no fatbin and no source", d.Ordinal)
		}
		return nil, ferr
	}
	if ferr != nil && !errors.Is(ferr, fs.ErrNotExist) && !IsCode(ferr, ErrorNoBinaryForGPU) &&
		!IsCode(ferr, ErrorInvalidImage) && !IsCode(ferr, ErrorUnsupportedPTX) {
		return nil, ferr
	}
	return d.LoadSource(ctx, src.Source, cache)
}

// LoadSources builds reqs for this device with b (in parallel, sharing
// the work with other processes through b.Cache; see Builder) and loads
// one module per request (in parallel too), in request order. A request's
// Arch 0 means this device's architecture. A cached image the driver
// rejects is compiled again. On failure nothing stays loaded and the
// error is a *BuildError naming the request (or the context's error).
func (d *Device) LoadSources(ctx context.Context, reqs []CompileRequest, b *Builder) ([]*Module, error) {
	reqs = append([]CompileRequest(nil), reqs...)
	for i := range reqs {
		if reqs[i].Arch == 0 {
			reqs[i].Arch = d.Arch()
		}
	}
	built, err := b.Build(ctx, reqs)
	if err != nil {
		return nil, err
	}
	// Loading is parallel too: on a warm cache it is most of the time.
	mods := make([]*Module, len(reqs))
	idx := make([]int, len(reqs))
	for i := range idx {
		idx[i] = i
	}
	err = b.forEach(ctx, idx, func(ctx context.Context, i int) error {
		var err error
		mods[i], err = d.loadBuilt(ctx, reqs[i], built[i], b)
		return buildError(reqs, i, err)
	})
	if err != nil {
		for _, m := range mods {
			if m != nil {
				m.Unload()
			}
		}
		return nil, err
	}
	return mods, nil
}

// loadBuilt loads one built image; a cached one the driver rejects is
// compiled again and replaced in the cache.
func (d *Device) loadBuilt(ctx context.Context, req CompileRequest, bl Built, b *Builder) (*Module, error) {
	origin := "nvrtc-cache"
	if bl.Compiled {
		origin = "nvrtc"
	}
	m, err := d.loadModule(bl.Image, origin)
	if err == nil || bl.Compiled {
		return m, err
	}
	if b.Cache != nil {
		b.Cache.corrupt.Add(1)
	}
	img, err := b.compile(ctx, req)
	if err != nil {
		return nil, err
	}
	if k, ok := b.key(req); ok {
		_ = b.Cache.Put(k, img)
	}
	return d.loadModule(img, "nvrtc")
}
