//go:build cgo

package cuda_test

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
)

// tinySM80 holds sm_80 code only (see fatbin_test.go for how it was built).
//
//go:embed testdata/tiny_sm80.fatbin
var tinySM80 []byte

//go:embed testdata/test_kernels.cu
var testKernels string

//go:embed testdata/collgen_test.cuh
var testHeader string

func testRequest() cuda.CompileRequest {
	return cuda.CompileRequest{
		Name:    "test_kernels.cu",
		Source:  testKernels,
		Headers: map[string]string{"collgen_test.cuh": testHeader},
		Options: []string{"--std=c++17"},
	}
}

// loadTestModule compiles the test kernels for d through a private cache.
func loadTestModule(t testing.TB, d *cuda.Device) *cuda.Module {
	t.Helper()
	m, err := d.LoadSource(context.Background(), testRequest(), &cuda.Cache{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("LoadSource: %v", err)
	}
	t.Cleanup(func() { m.Unload() })
	return m
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// w4Args lays out struct collgen_args_w4 (56 bytes).
func w4Args(in []cuda.DevicePtr, out cuda.DevicePtr, n, world int) []byte {
	b := make([]byte, 56)
	for i, p := range in {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(p))
	}
	binary.LittleEndian.PutUint64(b[32:], uint64(out))
	binary.LittleEndian.PutUint64(b[40:], uint64(n))
	binary.LittleEndian.PutUint32(b[48:], uint32(world))
	return b
}

// incArgs lays out struct inc_args (24 bytes).
func incArgs(x cuda.DevicePtr, n int, add float32) []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint64(b[0:], uint64(x))
	binary.LittleEndian.PutUint64(b[8:], uint64(n))
	binary.LittleEndian.PutUint32(b[16:], math.Float32bits(add))
	return b
}

func TestMissingLibraries(t *testing.T) {
	t.Setenv(cuda.EnvCUDAPath, "/nonexistent/libcuda.so.1")
	t.Setenv(cuda.EnvNVRTCPath, "/nonexistent/libnvrtc.so.13")
	err := cuda.LoadDriverForTest()
	var le *cuda.LibraryError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
		t.Fatalf("bogus driver path: got %v, want LibraryError naming the path", err)
	}
	err = cuda.LoadNVRTCForTest()
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "/nonexistent/libnvrtc.so.13") {
		t.Fatalf("bogus nvrtc path: got %v, want LibraryError naming the path", err)
	}
	t.Logf("driver: %v", cuda.LoadDriverForTest())
	t.Logf("nvrtc: %v", err)

	// A real library that is not CUDA: the error names the missing symbol.
	t.Setenv(cuda.EnvCUDAPath, "libm.so.6")
	t.Setenv(cuda.EnvNVRTCPath, "libm.so.6")
	if err := cuda.LoadDriverForTest(); !errors.As(err, &le) || le.Symbol != "cuInit" {
		t.Fatalf("libm as libcuda: got %v, want missing symbol cuInit", err)
	}
	if err := cuda.LoadNVRTCForTest(); !errors.As(err, &le) || le.Symbol != "nvrtcVersion" {
		t.Fatalf("libm as libnvrtc: got %v, want missing symbol nvrtcVersion", err)
	}
	// ... and says what to install or set, as a library not found does.
	if err := cuda.LoadDriverForTest(); !strings.Contains(err.Error(), cuda.EnvCUDAPath) {
		t.Errorf("libm as libcuda: %v; want the hint naming %s", err, cuda.EnvCUDAPath)
	}
	if err := cuda.LoadNVRTCForTest(); !strings.Contains(err.Error(), cuda.EnvNVRTCPath) {
		t.Errorf("libm as libnvrtc: %v; want the hint naming %s", err, cuda.EnvNVRTCPath)
	}
}

func TestCacheFileFormat(t *testing.T) {
	c := &cuda.Cache{Dir: t.TempDir()}
	var k1, k2 cuda.CacheKey
	k1[0], k2[0] = 1, 2
	img := bytes.Repeat([]byte("\x7fELF-cubin-"), 100)
	if _, ok := c.Get(k1); ok {
		t.Fatal("hit in empty cache")
	}
	if err := c.Put(k1, img); err != nil {
		t.Fatal(err)
	}
	got, ok := c.Get(k1)
	if !ok || !bytes.Equal(got, img) {
		t.Fatalf("Get after Put: ok=%v equal=%v", ok, bytes.Equal(got, img))
	}
	// A foreign file (another key's entry) under k2's name is rejected.
	data, _ := os.ReadFile(c.Path(k1))
	os.WriteFile(c.Path(k2), data, 0o644)
	if _, ok := c.Get(k2); ok {
		t.Fatal("foreign entry accepted")
	}
	// Flipped payload byte, truncation, garbage: all rejected.
	for name, mutate := range map[string]func([]byte) []byte{
		"flip":     func(b []byte) []byte { b = bytes.Clone(b); b[len(b)-1] ^= 0xff; return b },
		"truncate": func(b []byte) []byte { return b[:len(b)-7] },
		"garbage":  func([]byte) []byte { return []byte("not a cache file") },
		"empty":    func([]byte) []byte { return nil },
	} {
		os.WriteFile(c.Path(k1), mutate(data), 0o644)
		if _, ok := c.Get(k1); ok {
			t.Errorf("%s: corrupt entry accepted", name)
		}
	}
	st := c.Stats()
	if st.Corrupt != 5 || st.Hits != 1 || st.Misses != 1 {
		t.Errorf("stats = %+v, want 1 hit, 1 miss, 5 corrupt", st)
	}
	// Rewriting repairs the entry.
	if err := c.Put(k1, img); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Get(k1); !ok {
		t.Fatal("repaired entry not found")
	}
}

// TestCachePutReadableByOthers: an entry is readable by the other users
// of a shared cache directory (0644, as the lock files and the 0755
// directory are), so they load it instead of compiling it again and
// renaming their own, unreadable to the first user, over it.
func TestCachePutReadableByOthers(t *testing.T) {
	c := &cuda.Cache{Dir: t.TempDir()}
	var k cuda.CacheKey
	if err := c.Put(k, []byte("\x7fELF")); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(c.Path(k))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o644 {
		t.Errorf("cache entry mode %v, want -rw-r--r--", st.Mode().Perm())
	}
}

// TestCacheConcurrentWriters has many writers race on one key while readers
// read: a reader must only ever see a miss or a complete, valid entry.
func TestCacheConcurrentWriters(t *testing.T) {
	c := &cuda.Cache{Dir: t.TempDir()}
	var k cuda.CacheKey
	k[31] = 7
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bad sync.Map
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if img, ok := c.Get(k); ok && img[0] != 0x7f {
					bad.Store("reader", true)
				}
			}
		}()
	}
	var wwg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			for i := 0; i < 50; i++ {
				img := append([]byte("\x7fELF"), bytes.Repeat([]byte{byte(w)}, 1000*(w+1)+i)...)
				if err := c.Put(k, img); err != nil {
					bad.Store(fmt.Sprint("put ", err), true)
				}
			}
		}()
	}
	wwg.Wait()
	close(stop)
	wg.Wait()
	bad.Range(func(k, _ any) bool { t.Errorf("bad: %v", k); return true })
	if st := c.Stats(); st.Corrupt != 0 {
		t.Errorf("readers saw %d corrupt entries", st.Corrupt)
	}
	left, _ := os.ReadDir(c.Dir)
	if len(left) != 1 {
		t.Errorf("cache dir holds %d files, want 1 (temp files left behind?)", len(left))
	}
}

func TestDeviceInfo(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	v, err := cuda.DriverVersion()
	if err != nil {
		t.Fatal(err)
	}
	free, total, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v, driver %d (%s), %s, mem %d/%d MiB free", d, v, cuda.DriverPath(), d.PCIBusID, free>>20, total>>20)
	if d.SMCount <= 0 || d.Arch() < 30 {
		t.Errorf("implausible device %+v", d)
	}
	// Error formatting carries the call, the size, the device and the name.
	_, err = d.Alloc(1 << 50)
	if err == nil || !cuda.IsCode(err, cuda.ErrorOutOfMemory) ||
		!strings.Contains(err.Error(), fmt.Sprintf("cuMemAlloc(%d bytes) on device %d: CUDA_ERROR_OUT_OF_MEMORY", 1<<50, d.Ordinal)) {
		t.Errorf("huge alloc: %v", err)
	}
	t.Logf("huge alloc error: %v", err)
}

// devAlloc allocates n bytes on d, freed when the test ends.
func devAlloc(t testing.TB, d *cuda.Device, n int) cuda.DevicePtr {
	t.Helper()
	p, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	return p
}

func TestAllocCopyRoundTrip(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	const n = 1 << 20
	a, b := devAlloc(t, d, n), devAlloc(t, d, n)
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	if err := d.CopyHtoD(a, src); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyDtoD(b, a, n); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, n)
	if err := d.CopyDtoH(dst, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("round trip mismatch")
	}
	base, size, err := d.AddressRange(a + 100)
	if err != nil || base != a || size < n {
		t.Errorf("AddressRange(a+100) = %#x, %d, %v; want %#x, >=%d", base, size, err, a, n)
	}
}

func TestMemset(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	const n = 4096
	p := devAlloc(t, d, n)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if err := d.Memset8(p, 0xab, n); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, n)
	d.CopyDtoH(out, p)
	if !bytes.Equal(out, bytes.Repeat([]byte{0xab}, n)) {
		t.Fatal("Memset8 mismatch")
	}
	if err := d.MemsetD32Async(p, 0xdeadbeef, n/4-1, s); err != nil {
		t.Fatal(err)
	}
	if err := d.Memset8Async(p+n-4, 0x11, 4, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	d.CopyDtoH(out, p)
	for i := 0; i < n/4-1; i++ {
		if w := binary.LittleEndian.Uint32(out[4*i:]); w != 0xdeadbeef {
			t.Fatalf("word %d = %#x", i, w)
		}
	}
	if !bytes.Equal(out[n-4:], []byte{0x11, 0x11, 0x11, 0x11}) {
		t.Fatal("Memset8Async tail mismatch")
	}
	if err := d.MemsetD32(p, 7, n/4); err != nil {
		t.Fatal(err)
	}
	d.CopyDtoH(out, p)
	if binary.LittleEndian.Uint32(out[n-4:]) != 7 {
		t.Fatal("MemsetD32 mismatch")
	}
}

// TestSyncCallsWait: the synchronous memsets and copies have finished when
// they return, as seen from a non-blocking stream (a communicator's): the
// last bytes of a 256 MiB memset or copy, read on such a stream right
// after the call, hold the new value. The driver's cuMemsetD8/D32 and
// cuMemcpyDtoD return before they run, and cuMemcpyHtoD from pageable
// memory before its last chunk lands; on their own they read old bytes.
func TestSyncCallsWait(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	const n, tail = 256 << 20, 4096
	a, b := devAlloc(t, d, n), devAlloc(t, d, n)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	pin, err := d.HostAlloc(tail, false)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Free()
	src := bytes.Repeat([]byte{0x5c}, n)
	for i, tc := range []struct {
		name string
		dst  cuda.DevicePtr
		want byte
		call func() error
	}{
		{"Memset8", a, 0x3a, func() error { return d.Memset8(a, 0x3a, n) }},
		{"MemsetD32", a, 0x7e, func() error { return d.MemsetD32(a, 0x7e7e7e7e, n/4) }},
		{"CopyHtoD", b, 0x5c, func() error { return d.CopyHtoD(b, src) }},
		{"CopyDtoD", b, 0x7e, func() error { return d.CopyDtoD(b, a, n) }}, // a: MemsetD32's bytes
	} {
		for round := range 3 {
			// The old value first, finished before the call.
			if err := d.Memset8Async(tc.dst, byte(i+round+1), n, s); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if err := tc.call(); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if err := d.CopyDtoHAsync(pin.Bytes, tc.dst+n-tail, s); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(pin.Bytes, bytes.Repeat([]byte{tc.want}, tail)) {
				t.Fatalf("%s, round %d: a non-blocking stream read the last bytes as %#x.., want %#x: the call returned before it finished", tc.name, round, pin.Bytes[:4], tc.want)
			}
		}
	}
}

func TestStreamsEvents(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	const n = 64 << 20
	a, _ := d.Alloc(n)
	b, _ := d.Alloc(n)
	defer d.Free(a)
	defer d.Free(b)
	s1, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Destroy()
	s2, _ := d.NewStream()
	defer s2.Destroy()
	start, _ := d.NewEvent()
	end, _ := d.NewEvent()
	mid, _ := d.NewEvent()
	defer start.Destroy()
	defer end.Destroy()
	defer mid.Destroy()

	pin, err := d.HostAlloc(n, false)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Free()
	// Pageable Go memory is refused by the async copies.
	if err := d.CopyHtoDAsync(a, make([]byte, 16), s1); err == nil {
		t.Error("CopyHtoDAsync accepted Go heap memory")
	}

	if err := start.Record(s1); err != nil {
		t.Fatal(err)
	}
	d.MemsetD32Async(a, 0x01020304, n/4, s1)
	d.CopyDtoDAsync(b, a, n, s1)
	mid.Record(s1)
	// s2 copies b back only after s1's work.
	if err := s2.WaitEvent(mid); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyDtoHAsync(pin.Bytes, b, s2); err != nil {
		t.Fatal(err)
	}
	end.Record(s2)
	if err := end.Synchronize(); err != nil {
		t.Fatal(err)
	}
	ms, err := cuda.ElapsedMS(start, end)
	if err != nil {
		t.Fatal(err)
	}
	if ms <= 0 {
		t.Errorf("elapsed %v ms", ms)
	}
	if w := binary.LittleEndian.Uint32(pin.Bytes[n-4:]); w != 0x01020304 {
		t.Fatalf("ordered copy read %#x", w)
	}
	t.Logf("memset+D2D+D2H of %d MiB: %.3f ms", n>>20, ms)
}

func TestNVRTCLaunch(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	m := loadTestModule(t, d)
	const n = 100000
	var in [4]cuda.DevicePtr
	for w := range in {
		p, err := d.Alloc(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Free(p)
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(w+1) * float32(i%1000)
		}
		d.CopyHtoD(p, f32bytes(v))
		in[w] = p
	}
	out, _ := d.Alloc(4 * n)
	defer d.Free(out)
	s, _ := d.NewStream()
	defer s.Destroy()
	if err := m.Launch("sum_w4", cuda.Dim3(64), cuda.Dim3(256), 0, s, w4Args(in[:], out, n, 4)); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4*n)
	d.CopyDtoH(got, out)
	for i, x := range bytesF32(got) {
		if want := 10 * float32(i%1000); x != want {
			t.Fatalf("out[%d] = %v, want %v", i, x, want)
		}
	}
	// Parameter bigger than cg_launch's stack buffer.
	outb, _ := d.Alloc(4 * 256)
	defer d.Free(outb)
	big := make([]byte, 8+4*256)
	binary.LittleEndian.PutUint64(big, uint64(outb))
	for i := 0; i < 256; i++ {
		binary.LittleEndian.PutUint32(big[8+4*i:], math.Float32bits(float32(i)+0.5))
	}
	if err := m.Launch("big_arg", cuda.Dim3(1), cuda.Dim3(256), 0, nil, big); err != nil {
		t.Fatal(err)
	}
	gb := make([]byte, 4*256)
	if err := d.CopyDtoH(gb, outb); err != nil {
		t.Fatal(err)
	}
	for i, x := range bytesF32(gb) {
		if x != float32(i)+0.5 {
			t.Fatalf("big_arg out[%d] = %v", i, x)
		}
	}
	if _, err := m.Function("no_such_kernel"); !cuda.IsCode(err, cuda.ErrorNotFound) {
		t.Errorf("missing kernel: %v", err)
	}
}

func TestCompileError(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	_, err := cuda.Compile(context.Background(), cuda.CompileRequest{
		Name: "broken.cu", Source: "extern \"C\" __global__ void k() { undeclared_thing(); }", Arch: d.Arch()})
	var ce *cuda.CompileError
	if !errors.As(err, &ce) || !strings.Contains(ce.Log, "undeclared_thing") {
		t.Fatalf("got %v, want CompileError with log", err)
	}
	t.Logf("%v", err)
}

// TestCompileUnknownArch: an architecture the loaded NVRTC does not know
// (an NVRTC older than the GPU) fails with a *CompileError that names the
// NVRTC version and library, the architecture, and what to do. NVRTC
// only, no GPU.
func TestCompileUnknownArch(t *testing.T) {
	maj, min, path, err := cuda.NVRTCVersion()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	_, err = cuda.Compile(context.Background(), cuda.CompileRequest{
		Name: "k.cu", Source: "extern \"C\" __global__ void k() {}", Arch: 990})
	var ce *cuda.CompileError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want a *CompileError", err)
	}
	for _, want := range []string{fmt.Sprintf("NVRTC %d.%d", maj, min), path, "sm_990", cuda.EnvNVRTCPath, "fatbin"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestCacheHitAndCorruptRebuild(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	c := &cuda.Cache{Dir: t.TempDir()}
	ctx := context.Background()
	load := func() (*cuda.Module, time.Duration) {
		t0 := time.Now()
		m, err := d.LoadSource(ctx, testRequest(), c)
		if err != nil {
			t.Fatal(err)
		}
		m.Unload()
		return m, time.Since(t0)
	}
	m1, cold := load()
	m2, warm := load()
	if m1.Origin != "nvrtc" || m2.Origin != "nvrtc-cache" {
		t.Fatalf("origins %q, %q; want nvrtc, nvrtc-cache", m1.Origin, m2.Origin)
	}
	t.Logf("cold %v, warm %v", cold, warm)
	req := testRequest()
	req.Arch = d.Arch()
	k, err := c.Key(req)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(c.Path(k))
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x5a
	os.WriteFile(c.Path(k), data, 0o644)
	m3, _ := load()
	m4, _ := load()
	if m3.Origin != "nvrtc" || m4.Origin != "nvrtc-cache" {
		t.Fatalf("after corruption origins %q, %q; want nvrtc, nvrtc-cache", m3.Origin, m4.Origin)
	}
	if st := c.Stats(); st.Corrupt != 1 || st.Hits != 2 {
		t.Errorf("stats %+v", st)
	}
	// Different options are a different key.
	req2 := req
	req2.Options = append(req2.Options, "-DEXTRA=1")
	k2, _ := c.Key(req2)
	if k2 == k {
		t.Error("options not part of the key")
	}
}

func TestGraphCaptureReplay(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	m := loadTestModule(t, d)
	const n, launches, replays = 1 << 16, 3, 10
	x, _ := d.Alloc(4 * n)
	defer d.Free(x)
	d.MemsetD32(x, 0, n)
	s, _ := d.NewStream()
	defer s.Destroy()
	fn, err := m.Function("inc")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	// Another goroutine keeps using the device during the capture.
	// (cuMemFree is left until after the capture: it may synchronise.)
	done := make(chan error)
	var other cuda.DevicePtr
	go func() {
		var err error
		other, err = d.Alloc(1 << 20)
		if err == nil {
			err = d.Memset8(other, 1, 1<<20)
		}
		done <- err
	}()
	for i := 0; i < launches; i++ {
		if err := fn.Launch(cuda.Dim3(64), cuda.Dim3(256), 0, s, incArgs(x, n, float32(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Errorf("other goroutine during capture: %v", err)
	}
	g, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()
	d.Free(other)
	ge, err := g.Instantiate()
	if err != nil {
		t.Fatal(err)
	}
	defer ge.Destroy()
	// Capture only records: nothing ran yet.
	w := make([]byte, 4)
	d.CopyDtoH(w, x)
	if v := bytesF32(w)[0]; v != 0 {
		t.Fatalf("x[0] = %v after capture, want 0", v)
	}
	start, _ := d.NewEvent()
	end, _ := d.NewEvent()
	defer start.Destroy()
	defer end.Destroy()
	start.Record(s)
	for i := 0; i < replays; i++ {
		if err := ge.Launch(s); err != nil {
			t.Fatal(err)
		}
	}
	end.Record(s)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	ms, _ := cuda.ElapsedMS(start, end)
	out := make([]byte, 4*n)
	d.CopyDtoH(out, x)
	for i, v := range bytesF32(out) {
		if v != replays*(1+2+3) {
			t.Fatalf("x[%d] = %v, want %v", i, v, replays*6)
		}
	}
	t.Logf("%d replays of a %d-launch graph: %.3f ms (%.2f us/replay)", replays, launches, ms, 1000*ms/replays)
}

func TestPinnedMappedHandshake(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	m := loadTestModule(t, d)
	hb, err := d.HostAlloc(4096, true)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Free()
	if hb.DevPtr == 0 {
		t.Fatal("mapped buffer has no device pointer")
	}
	args := make([]byte, 24)
	binary.LittleEndian.PutUint64(args[0:], uint64(hb.DevPtr))
	binary.LittleEndian.PutUint64(args[8:], 5_000_000) // ~5 s of 1 us sleeps
	binary.LittleEndian.PutUint32(args[16:], 40)
	s, _ := d.NewStream()
	defer s.Destroy()
	if err := m.Launch("flag_handshake", cuda.Dim3(1), cuda.Dim3(32), 0, s, args); err != nil {
		t.Fatal(err)
	}
	// The kernel is running: wait to see its flag, then answer it.
	deadline := time.Now().Add(5 * time.Second)
	for hb.LoadUint32(0) != 40 {
		if time.Now().After(deadline) {
			t.Fatalf("host never saw the kernel's flag (flag=%d)", hb.LoadUint32(0))
		}
		time.Sleep(10 * time.Microsecond)
	}
	hb.StoreUint32(4, 1)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if f := hb.LoadUint32(0); f != 41 {
		t.Fatalf("flag = %d after handshake, want 41 (42 = kernel never saw the host's ack)", f)
	}
}

func TestFatbin(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	// A missing fatbin falls back to NVRTC.
	m, err := d.LoadKernels(context.Background(), cuda.KernelSource{
		FatbinPath: "/nonexistent/collgen.fatbin", Source: testRequest()}, &cuda.Cache{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if m.Origin != "nvrtc" {
		t.Errorf("fallback origin %q", m.Origin)
	}
	m.Unload()
	path := os.Getenv("COLLGEN_TEST_FATBIN")
	if path == "" {
		t.Skip("COLLGEN_TEST_FATBIN not set (tests/gpu/run.sh builds one with nvcc)")
	}
	m, err = d.LoadKernels(context.Background(), cuda.KernelSource{FatbinPath: path, Source: testRequest()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	if m.Origin != "fatbin:"+path {
		t.Fatalf("origin %q, want the fatbin", m.Origin)
	}
	x, _ := d.Alloc(4 * 1024)
	defer d.Free(x)
	d.MemsetD32(x, 0, 1024)
	if err := m.Launch("inc", cuda.Dim3(4), cuda.Dim3(256), 0, nil, incArgs(x, 1024, 2.5)); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4*1024)
	if err := d.CopyDtoH(out, x); err != nil {
		t.Fatal(err)
	}
	if v := bytesF32(out)[1023]; v != 2.5 {
		t.Fatalf("x[1023] = %v", v)
	}
}

// TestFatbinArchMismatch: a fatbin without code for the device (sm_80
// only, on a newer major) is a *FatbinError listing what it holds, over
// CUDA_ERROR_NO_BINARY_FOR_GPU; a missing file is one over fs.ErrNotExist;
// LoadKernels still falls back to NVRTC for both.
func TestFatbinArchMismatch(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	if d.Major == 8 {
		t.Skip("the test fatbin's sm_80 code runs on this sm_8x device")
	}
	_, err := d.LoadFatbin(tinySM80, "tiny_sm80")
	var fe *cuda.FatbinError
	if !errors.As(err, &fe) || !cuda.IsCode(err, cuda.ErrorNoBinaryForGPU) || len(fe.Codes) != 1 || fe.Codes[0].String() != "sm_80" {
		t.Fatalf("LoadFatbin(sm_80 only) on sm_%d: %v; want a *FatbinError holding sm_80 over NO_BINARY_FOR_GPU", d.Arch(), err)
	}
	t.Log(err)
	_, err = d.LoadFatbinFile(filepath.Join(t.TempDir(), "none.fatbin"))
	if !errors.As(err, &fe) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing fatbin: %v; want a *FatbinError over fs.ErrNotExist", err)
	}
	m, err := d.LoadKernels(context.Background(), cuda.KernelSource{Fatbin: tinySM80, Source: testRequest()}, &cuda.Cache{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	if m.Origin != "nvrtc" {
		t.Fatalf("origin %q, want nvrtc (fallback)", m.Origin)
	}
}

// TestLoadSourcesShared: two Builders over one cache (two ranks of a
// host) load the same programs; between them each is compiled once, and
// the loaded modules run.
func TestLoadSourcesShared(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	cache := &cuda.Cache{Dir: t.TempDir()}
	reqs := []cuda.CompileRequest{testRequest()}
	other := testRequest()
	other.Name, other.Options = "test_kernels_2.cu", append(other.Options, "-DCOLLGEN_TEST_VARIANT=2")
	reqs = append(reqs, other)
	var wg sync.WaitGroup
	mods := make([][]*cuda.Module, 2)
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mods[r], errs[r] = d.LoadSources(context.Background(), reqs, &cuda.Builder{Cache: cache, Start: r})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	compiled := 0
	for r := range mods {
		for _, m := range mods[r] {
			if m.Origin == "nvrtc" {
				compiled++
			}
			if _, err := m.Function("inc"); err != nil {
				t.Fatal(err)
			}
			m.Unload()
		}
	}
	if compiled != len(reqs) {
		t.Fatalf("%d compiles for %d programs over one cache, want one each", compiled, len(reqs))
	}
	bad := testRequest()
	bad.Name, bad.Source = "bad.cu", "this is not CUDA"
	_, err := d.LoadSources(context.Background(), []cuda.CompileRequest{testRequest(), bad}, &cuda.Builder{Cache: cache})
	var be *cuda.BuildError
	var ce *cuda.CompileError
	if !errors.As(err, &be) || be.Index != 1 || be.Name != "bad.cu" || !errors.As(err, &ce) {
		t.Fatalf("bad program: %v; want a *BuildError for request 1 over a *CompileError", err)
	}
}

// TestPeerAccess runs one goroutine per GPU: each fills its buffer, enables
// peer access to the other, then sums both GPUs' buffers with a kernel that
// reads the peer's memory directly, and also copies the peer buffer D2D.
func TestPeerAccess(t *testing.T) {
	devs := cudatest.Devices(t, 2)
	if ok, err := devs[0].CanAccessPeer(devs[1]); err != nil || !ok {
		t.Skipf("devices 0 and 1 have no peer access (%v)", err)
	}
	const n = 1 << 20
	bufs := make([]cuda.DevicePtr, 2)
	var ready, used, exited sync.WaitGroup
	ready.Add(2)
	used.Add(2)
	exited.Add(2)
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		go func() {
			defer exited.Done()
			d, peer := devs[r], devs[1-r]
			// Phase 1: allocate, fill, enable peer access.
			p, err := d.Alloc(4 * n)
			if err == nil {
				err = d.MemsetD32(p, math.Float32bits(float32(r+1)), n)
			}
			if err == nil {
				err = d.EnablePeerAccess(peer)
			}
			if err == nil {
				err = d.EnablePeerAccess(peer) // idempotent
			}
			bufs[r] = p
			ready.Done()
			ready.Wait()
			// Phase 2: use the peer's buffer (skipped if either failed).
			if err == nil && bufs[1-r] != 0 {
				err = peerCheck(d, bufs, r, n)
			}
			errs[r] = err
			used.Done()
			used.Wait() // the peer is done reading p
			d.Free(p)
		}()
	}
	exited.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func peerCheck(d *cuda.Device, bufs []cuda.DevicePtr, r, n int) error {
	m, err := d.LoadSource(context.Background(), testRequest(), &cuda.Cache{Dir: os.TempDir() + "/collgen-peer-test"})
	if err != nil {
		return err
	}
	defer m.Unload()
	out, err := d.Alloc(4 * n)
	if err != nil {
		return err
	}
	defer d.Free(out)
	if err := m.Launch("sum_w4", cuda.Dim3(128), cuda.Dim3(256), 0, nil, w4Args(bufs, out, n, 2)); err != nil {
		return err
	}
	got := make([]byte, 4*n)
	if err := d.CopyDtoH(got, out); err != nil {
		return err
	}
	for i, v := range bytesF32(got) {
		if v != 3 {
			return fmt.Errorf("sum[%d] = %v, want 3", i, v)
		}
	}
	if err := d.CopyDtoD(out, bufs[1-r], 4*n); err != nil {
		return err
	}
	if err := d.CopyDtoH(got, out); err != nil {
		return err
	}
	if v := bytesF32(got)[n-1]; v != float32(2-r) {
		return fmt.Errorf("peer copy read %v, want %v", v, 2-r)
	}
	return nil
}

// TestCacheConcurrentProcesses re-executes the test binary as several
// processes that fill and read one cache entry at once; no reader may see
// a corrupt entry and no temporary file may be left behind.
func TestCacheConcurrentProcesses(t *testing.T) {
	var k cuda.CacheKey
	k[0] = 0xcc
	if dir := os.Getenv("COLLGEN_CACHE_TEST_CHILD"); dir != "" {
		c := &cuda.Cache{Dir: dir}
		w := os.Getpid() % 251
		for i := 0; i < 100; i++ {
			img := append([]byte("\x7fELF"), bytes.Repeat([]byte{byte(w)}, 5000+97*i)...)
			if err := c.Put(k, img); err != nil {
				t.Fatal(err)
			}
			c.Get(k)
		}
		if st := c.Stats(); st.Corrupt != 0 {
			t.Fatalf("child saw %d corrupt entries", st.Corrupt)
		}
		return
	}
	dir := t.TempDir()
	cuda.RunTestChildren(t, "TestCacheConcurrentProcesses", 4, func(int) []string { return []string{"COLLGEN_CACHE_TEST_CHILD=" + dir} })
	c := &cuda.Cache{Dir: dir}
	if _, ok := c.Get(k); !ok {
		t.Error("final entry invalid")
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 {
		t.Errorf("cache dir holds %d files, want 1", len(left))
	}
}

// TestHostAllocZeroed: HostAlloc's bytes are zero even where the driver
// hands back a buffer just freed with other contents (it did, on an H100:
// a status word a kernel had written).
func TestHostAllocZeroed(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	for i := range 16 {
		hb, err := d.HostAlloc(8+8*(i%2), true)
		if err != nil {
			t.Fatal(err)
		}
		for j, b := range hb.Bytes {
			if b != 0 {
				hb.Free()
				t.Fatalf("allocation %d: byte %d is %#x, want 0", i, j, b)
			}
		}
		for j := range hb.Bytes {
			hb.Bytes[j] = 0xa5
		}
		if err := hb.Free(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoadSourceCompilesOnce: ranks of one host loading the same program
// on first use (Config.LazyKernels) compile it once between them:
// LoadSource takes the program's lock in the cache as Builder does.
func TestLoadSourceCompilesOnce(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	c := &cuda.Cache{Dir: t.TempDir()}
	const n = 4
	origins := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := d.LoadSource(context.Background(), testRequest(), c)
			if err != nil {
				errs[i] = err
				return
			}
			origins[i] = m.Origin
			m.Unload()
		}()
	}
	wg.Wait()
	compiled := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if origins[i] == "nvrtc" {
			compiled++
		}
	}
	if compiled != 1 {
		t.Fatalf("origins %v: %d compiles, want 1", origins, compiled)
	}
	if st := c.Stats(); st.Misses != 1 || st.Hits != n-1 {
		t.Errorf("stats %+v; want 1 miss and %d hits", st, n-1)
	}
}

// TestUseAfterDestroyGPU: a destroyed stream is refused, not taken for
// the legacy default stream its 0 handle names (a launch on it ran on
// the legacy stream; Synchronize waited for that one), and a Function of
// an unloaded module is refused rather than launched from freed driver
// state.
func TestUseAfterDestroyGPU(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	m, err := d.LoadSource(context.Background(), testRequest(), &cuda.Cache{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("LoadSource: %v", err)
	}
	f, err := m.Function("inc")
	if err != nil {
		t.Fatal(err)
	}
	x, err := d.Alloc(4 * 64)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(x)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	if err := f.Launch(cuda.Dim3(1), cuda.Dim3(64), 0, s, incArgs(x, 64, 1)); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("launch on a destroyed stream: %v, want ErrInvalidArgument", err)
	}
	if err := s.Synchronize(); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("Synchronize of a destroyed stream: %v, want ErrInvalidArgument", err)
	}
	if err := d.MemsetD32Async(x, 0, 64, s); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("memset on a destroyed stream: %v, want ErrInvalidArgument", err)
	}
	if err := m.Unload(); err != nil {
		t.Fatal(err)
	}
	if err := m.Unload(); err != nil {
		t.Fatalf("second Unload: %v", err)
	}
	if err := f.Launch(cuda.Dim3(1), cuda.Dim3(64), 0, nil, incArgs(x, 64, 1)); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("launch from an unloaded module: %v, want ErrInvalidArgument", err)
	}
	if _, err := m.Function("inc"); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Errorf("lookup in an unloaded module: %v, want ErrInvalidArgument", err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatalf("the context faulted: %v", err)
	}
}
