//go:build cgo

package cuda_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
)

// kernelSet reads the .cu files of $COLLGEN_CUDA_DIR (default
// generated/cuda, looked up from the repository root or this package) as
// compile requests; every other file in the directory tree is offered as a
// header under its relative path. Extra NVRTC options come from
// $COLLGEN_NVRTC_OPTIONS (space separated). Skips when there is no set.
func kernelSet(b testing.TB, arch int) []cuda.CompileRequest {
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
			headers[rel] = stripOffsetof(b, rel, string(data))
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

// stripOffsetof drops header lines using __builtin_offsetof when
// $COLLGEN_BENCH_STRIP_OFFSETOF=1: NVRTC 13.0 has no such builtin, and the
// generated layout asserts use it. The asserts cost nothing to compile, so
// the timings stand; the real fix belongs in the generator's template.
func stripOffsetof(b testing.TB, name, src string) string {
	if os.Getenv("COLLGEN_BENCH_STRIP_OFFSETOF") != "1" || !strings.Contains(src, "__builtin_offsetof") {
		return src
	}
	lines := strings.Split(src, "\n")
	n := 0
	for i, l := range lines {
		if strings.Contains(l, "__builtin_offsetof") {
			lines[i] = "// (layout assert stripped for NVRTC)"
			n++
		}
	}
	b.Logf("%s: stripped %d __builtin_offsetof lines (COLLGEN_BENCH_STRIP_OFFSETOF=1)", name, n)
	return strings.Join(lines, "\n")
}

// compileArch is the architecture the compile benchmarks target:
// $COLLGEN_BENCH_ARCH (as 90 for sm_90) when set, so they run where NVRTC
// is installed without a GPU (NVRTC needs no device), else the first
// device's.
func compileArch(b testing.TB) int {
	if s := os.Getenv("COLLGEN_BENCH_ARCH"); s != "" {
		a, err := strconv.Atoi(strings.TrimPrefix(s, "sm_"))
		if err != nil || a <= 0 {
			b.Fatalf("COLLGEN_BENCH_ARCH=%q: want a compute capability such as 90", s)
		}
		return a
	}
	return cudatest.Devices(b, 1)[0].Arch()
}

// BenchmarkNVRTCCompile is the cold compile of the whole kernel set, one
// file after another (ms/set is the figure to quote).
func BenchmarkNVRTCCompile(b *testing.B) {
	reqs := kernelSet(b, compileArch(b))
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

// BenchmarkNVRTCCompileParallel compiles the set on one goroutine per CPU
// (NVRTC programs are independent): the wall time of a cold start whose
// loader compiles concurrently. sum-ms/set, the compile times added up,
// stands in for the serial cost (somewhat above it: the compiles share
// memory bandwidth), so NVRTC options can be compared in seconds each
// ($COLLGEN_NVRTC_OPTIONS; tests/gpu/coldstart.sh does).
func BenchmarkNVRTCCompileParallel(b *testing.B) {
	reqs := kernelSet(b, compileArch(b))
	var mu sync.Mutex
	var sum, slowest time.Duration
	slowestName := ""
	times := map[string]time.Duration{}
	t0 := time.Now()
	for b.Loop() {
		if err := forEachParallel(reqs, func(r cuda.CompileRequest) error {
			t := time.Now()
			_, err := cuda.Compile(context.Background(), r)
			el := time.Since(t)
			mu.Lock()
			sum += el
			times[r.Name] = el
			if el > slowest {
				slowest, slowestName = el, r.Name
			}
			mu.Unlock()
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(t0).Milliseconds())/float64(b.N), "ms/set")
	b.ReportMetric(float64(sum.Milliseconds())/float64(b.N), "sum-ms/set")
	b.ReportMetric(float64(runtime.NumCPU()), "workers")
	b.Logf("slowest file: %s %v", slowestName, slowest)
	logCompileTimes(b, times)
}

// worldOf is a kernel file's world size suffix ("w8" of ..._w8.cu), or
// "other".
func worldOf(name string) string {
	i := strings.LastIndex(name, "_w")
	if i < 0 || !strings.HasSuffix(name, ".cu") {
		return "other"
	}
	return name[i+1 : len(name)-3]
}

// familyOf is a kernel file's collective and algorithm, the part of its
// name before the dtype or element size: "allreduce_oneshot_ll128" of
// allreduce_oneshot_ll128_f32_w8.cu, "allgather_oneshot" of
// allgather_oneshot_u16_w2.cu.
func familyOf(name string) string {
	f := strings.Split(name, "_")
	for i, w := range f {
		if coll.DType(w).Valid() || slices.Contains([]string{"u8", "u16", "u32", "u64"}, w) {
			return strings.Join(f[:i], "_")
		}
	}
	return "other"
}

// logCompileTimes logs the compile time summed by world size and by
// protocol/algorithm family, and the ten slowest files: where the cold
// start goes.
func logCompileTimes(b *testing.B, times map[string]time.Duration) {
	byWorld := map[string]time.Duration{}
	byAlg := map[string]time.Duration{}
	names := make([]string, 0, len(times))
	for n, d := range times {
		names = append(names, n)
		byWorld[worldOf(n)] += d
		byAlg[familyOf(n)] += d
	}
	sort.Slice(names, func(i, j int) bool { return times[names[i]] > times[names[j]] })
	for _, m := range []map[string]time.Duration{byWorld, byAlg} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var sb strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&sb, " %s=%v", k, m[k].Round(time.Millisecond))
		}
		b.Logf("compile time by group:%s", sb.String())
	}
	for _, n := range names[:min(10, len(names))] {
		b.Logf("slow: %-50s %v", n, times[n].Round(time.Millisecond))
	}
}

// BenchmarkNVRTCHeaderOnly compiles a program that includes the kernel
// set's headers and holds one empty kernel: the fixed cost every kernel
// file pays (NVRTC's start-up, parsing the headers) before its own code.
func BenchmarkNVRTCHeaderOnly(b *testing.B) {
	reqs := kernelSet(b, compileArch(b))
	req := reqs[0]
	req.Name = "header_only.cu"
	req.Source = ""
	for h := range req.Headers {
		if strings.HasSuffix(h, "collgen_common.cuh") {
			req.Source += "#include \"" + h + "\"\n"
		}
	}
	req.Source += "extern \"C\" __global__ void header_only() {}\n"
	ctx := context.Background()
	for b.Loop() {
		if _, err := cuda.Compile(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// forEachParallel runs fn over reqs on runtime.NumCPU() goroutines and
// returns the first error.
func forEachParallel(reqs []cuda.CompileRequest, fn func(cuda.CompileRequest) error) error {
	work := make(chan cuda.CompileRequest)
	errs := make(chan error, len(reqs))
	var wg sync.WaitGroup
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				if err := fn(r); err != nil {
					errs <- fmt.Errorf("%s: %w", r.Name, err)
				}
			}
		}()
	}
	for _, r := range reqs {
		work <- r
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs
}

// BenchmarkWarmLoad loads the whole set from a filled cache: key hashing,
// cache read and validation, and cuModuleLoadData for each file.
func BenchmarkWarmLoad(b *testing.B) {
	d := cudatest.Devices(b, 1)[0]
	reqs := kernelSet(b, d.Arch())
	benchWarmLoad(b, d, reqs, fillCache(b, d, reqs), "set")
}

// BenchmarkWarmLoadWorld is BenchmarkWarmLoad for the kernels of one world
// size at a time (a sub-benchmark per world: w2, w3, ...): what a warm
// comm.New loads, since it readies only its world size's kernels.
func BenchmarkWarmLoadWorld(b *testing.B) {
	d := cudatest.Devices(b, 1)[0]
	reqs := kernelSet(b, d.Arch())
	cache := fillCache(b, d, reqs)
	byWorld := map[string][]cuda.CompileRequest{}
	for _, r := range reqs {
		byWorld[worldOf(r.Name)] = append(byWorld[worldOf(r.Name)], r)
	}
	worlds := make([]string, 0, len(byWorld))
	for w := range byWorld {
		worlds = append(worlds, w)
	}
	sort.Strings(worlds)
	for _, w := range worlds {
		b.Run(w, func(b *testing.B) { benchWarmLoad(b, d, byWorld[w], cache, "world") })
	}
}

// fillCache compiles reqs into a fresh cache, in parallel.
func fillCache(b *testing.B, d *cuda.Device, reqs []cuda.CompileRequest) *cuda.Cache {
	cache := &cuda.Cache{Dir: b.TempDir()}
	if err := forEachParallel(reqs, func(r cuda.CompileRequest) error {
		m, err := d.LoadSource(context.Background(), r, cache)
		if err == nil {
			m.Unload()
		}
		return err
	}); err != nil {
		b.Fatal(err)
	}
	return cache
}

// benchWarmLoad times loading reqs, one after another, from a cache that
// holds them all (each load must be a cache hit), reported as ms/<unit>.
func benchWarmLoad(b *testing.B, d *cuda.Device, reqs []cuda.CompileRequest, cache *cuda.Cache, unit string) {
	ctx := context.Background()
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
	b.ReportMetric(float64(time.Since(t0).Microseconds())/1000/float64(b.N), "ms/"+unit)
	b.ReportMetric(float64(len(reqs)), "files")
}

// TestNVRTCOptionsSameCode compiles every kernel of the set with and
// without the NVRTC options in $COLLGEN_SAME_CODE_OPTIONS (e.g. -minimal)
// and fails on each image that differs. An option that leaves every image
// byte for byte as it was changes no kernel's code, so adopting it in comm
// needs no proof or bench run, only the compile-time measurement
// (docs/cold-start.md). Skips unless the variable is set (the set takes
// seconds on many cores), without a GPU (images are for its architecture)
// and without a kernel set.
func TestNVRTCOptionsSameCode(t *testing.T) {
	extra := strings.Fields(os.Getenv("COLLGEN_SAME_CODE_OPTIONS"))
	if len(extra) == 0 {
		t.Skip("set COLLGEN_SAME_CODE_OPTIONS to the NVRTC options to check")
	}
	d := cudatest.Devices(t, 1)[0]
	reqs := kernelSet(t, d.Arch())
	var mu sync.Mutex
	var differ []string
	err := forEachParallel(reqs, func(r cuda.CompileRequest) error {
		base, err := cuda.Compile(context.Background(), r)
		if err != nil {
			return err
		}
		r.Options = append(slices.Clip(r.Options), extra...)
		with, err := cuda.Compile(context.Background(), r)
		if err != nil {
			return fmt.Errorf("with %q: %w", extra, err)
		}
		if !bytes.Equal(base, with) {
			mu.Lock()
			differ = append(differ, r.Name)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(differ)
	if len(differ) > 0 {
		t.Fatalf("%d of %d images differ with %q, e.g. %s", len(differ), len(reqs), extra, strings.Join(differ[:min(5, len(differ))], ", "))
	}
	t.Logf("all %d images identical with and without %q", len(reqs), extra)
}
