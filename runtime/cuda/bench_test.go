package cuda_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
)

// kernelSet reads the .cu files of $COLLGEN_CUDA_DIR (default
// generated/cuda, looked up from the repository root or this package) as
// compile requests; every other file in the directory tree is offered as a
// header under its relative path. Extra NVRTC options come from
// $COLLGEN_NVRTC_OPTIONS (space separated). Skips when there is no set.
func kernelSet(b *testing.B, arch int) []cuda.CompileRequest {
	b.Helper()
	dir := os.Getenv("COLLGEN_CUDA_DIR")
	if dir == "" {
		for _, d := range []string{"generated/cuda", "../../generated/cuda"} {
			if st, err := os.Stat(d); err == nil && st.IsDir() {
				dir = d
				break
			}
		}
	}
	if dir == "" {
		b.Skip("no kernel set: set COLLGEN_CUDA_DIR or run collgen generate (generated/cuda)")
	}
	headers := map[string]string{}
	var sources []string
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if strings.HasSuffix(p, ".cu") {
			sources = append(sources, rel)
			return nil
		}
		if strings.HasSuffix(p, ".h") || strings.HasSuffix(p, ".cuh") || strings.HasSuffix(p, ".hpp") {
			data, err := os.ReadFile(p)
			headers[rel] = string(data)
			return err
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	if len(sources) == 0 {
		b.Skipf("no .cu files in %s", dir)
	}
	sort.Strings(sources)
	opts := []string{"--std=c++17"}
	opts = append(opts, strings.Fields(os.Getenv("COLLGEN_NVRTC_OPTIONS"))...)
	var reqs []cuda.CompileRequest
	for _, s := range sources {
		data, err := os.ReadFile(filepath.Join(dir, s))
		if err != nil {
			b.Fatal(err)
		}
		reqs = append(reqs, cuda.CompileRequest{Name: s, Source: string(data), Headers: headers, Options: opts, Arch: arch})
	}
	b.Logf("kernel set: %d files from %s", len(reqs), dir)
	return reqs
}

// BenchmarkNVRTCCompile is the cold compile of the whole kernel set, one
// file after another (ms/set is the figure to quote).
func BenchmarkNVRTCCompile(b *testing.B) {
	d := cudatest.Devices(b, 1)[0]
	reqs := kernelSet(b, d.Arch())
	ctx := context.Background()
	t0 := time.Now()
	for b.Loop() {
		for _, r := range reqs {
			if _, err := cuda.Compile(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(time.Since(t0).Milliseconds())/float64(b.N), "ms/set")
	b.ReportMetric(float64(len(reqs)), "files")
}

// BenchmarkNVRTCCompileParallel compiles the set with all files at once
// (NVRTC programs are independent), the wall time a cold start pays when
// the loader compiles concurrently.
func BenchmarkNVRTCCompileParallel(b *testing.B) {
	d := cudatest.Devices(b, 1)[0]
	reqs := kernelSet(b, d.Arch())
	ctx := context.Background()
	t0 := time.Now()
	for b.Loop() {
		var wg sync.WaitGroup
		errs := make([]error, len(reqs))
		for i, r := range reqs {
			wg.Add(1)
			go func() { defer wg.Done(); _, errs[i] = cuda.Compile(ctx, r) }()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(time.Since(t0).Milliseconds())/float64(b.N), "ms/set")
}

// BenchmarkWarmLoad loads the whole set from a filled cache: key hashing,
// cache read and validation, and cuModuleLoadData for each file.
func BenchmarkWarmLoad(b *testing.B) {
	d := cudatest.Devices(b, 1)[0]
	reqs := kernelSet(b, d.Arch())
	ctx := context.Background()
	cache := &cuda.Cache{Dir: b.TempDir()}
	for _, r := range reqs { // fill the cache
		m, err := d.LoadSource(ctx, r, cache)
		if err != nil {
			b.Fatal(err)
		}
		m.Unload()
	}
	t0 := time.Now()
	for b.Loop() {
		for _, r := range reqs {
			m, err := d.LoadSource(ctx, r, cache)
			if err != nil {
				b.Fatal(err)
			}
			if m.Origin != "nvrtc-cache" {
				b.Fatalf("%s: origin %s, want a cache hit", r.Name, m.Origin)
			}
			m.Unload()
		}
	}
	b.ReportMetric(float64(time.Since(t0).Microseconds())/1000/float64(b.N), "ms/set")
}
