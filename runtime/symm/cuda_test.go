//go:build linux && (amd64 || arm64) && cgo

package symm

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// The GPU tests need two GPUs with peer access and VMM; they skip
// otherwise. Each rank is a goroutine with its own GPU and backend, except
// in TestCUDAProcessRanks and TestCUDAKilledRank. The group tests (peer
// access, graph signals, the worked example, release, process ranks) run
// on every visible GPU, or $COLLGEN_TEST_WORLD of them (cudatest.World);
// the others need two or one. With $COLLGEN_TEST_SHARE_GPU=1 every rank
// is on GPU 0 (cudatest.Shared), so one GPU runs them all.

//go:embed testdata/symm_test_kernels.cu
var testKernelsSrc string

//go:embed testdata/allreduce_scale.cu
var allReduceScaleSrc string

// gpuRanks opens world devices (0: the multi-GPU test world,
// cudatest.World) and makes a CUDA backend for each, skipping the test
// when the machine cannot run it. Backends close after the pools
// (cleanups run last-registered first).
func gpuRanks(t *testing.T, world int) ([]*cuda.Device, []*CUDABackend) {
	t.Helper()
	var devs []*cuda.Device
	if world == 0 {
		devs = cudatest.World(t, 2)
	} else {
		devs = cudatest.Devices(t, world)
	}
	world = len(devs)
	for _, d := range devs {
		if ok, err := d.VMMSupported(); err != nil || !ok {
			t.Skipf("%v: no VMM with POSIX descriptors (%v)", d, err)
		}
		for _, p := range devs {
			if ok, err := d.CanAccessPeer(p); err != nil || !ok {
				t.Skipf("%v cannot access %v (%v)", d, p, err)
			}
		}
	}
	bes := make([]*CUDABackend, world)
	for r, d := range devs {
		be, err := NewCUDABackend(d, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := be.Close(); err != nil {
				t.Errorf("rank %d: backend Close: %v", r, err)
			}
		})
		bes[r] = be
	}
	return devs, bes
}

// gpuPools forms a group of goroutine ranks, one GPU each (world as for
// gpuRanks).
func gpuPools(t *testing.T, world int) ([]*cuda.Device, []*CUDABackend, []*Pool) {
	devs, bes := gpuRanks(t, world)
	pools := newPools(t, len(devs), func(r int, c *Config) { c.Backend, c.Device = bes[r], r })
	return devs, bes, pools
}

// orderings makes a stream and a StreamOrdering per rank, released at the
// end of the test.
func orderings(t *testing.T, bes []*CUDABackend) []*StreamOrdering {
	t.Helper()
	ords := make([]*StreamOrdering, len(bes))
	for r, be := range bes {
		s, err := be.Device().NewStream()
		if err != nil {
			t.Fatal(err)
		}
		o, err := be.NewStreamOrdering(s)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			s.Synchronize()
			o.Close()
			s.Destroy()
		})
		ords[r] = o
	}
	return ords
}

// testModules compiles the test kernels for every device.
func testModules(t testing.TB, devs []*cuda.Device) []*cuda.Module {
	t.Helper()
	return loadKernels(t, devs, "symm_test_kernels.cu", testKernelsSrc, "poke", "inc", "check", "barrier_loop", "pingpong_loop")
}

// loadKernels compiles src for every device and looks up its kernels
// (names), before any rank launches one: CUDA loads a kernel at its first
// lookup, which may synchronize the context, and where ranks share a GPU
// that waits for a peer's kernel spinning for this rank (a deadlock until
// the timeout). Modules are unloaded at the test's end.
func loadKernels(t testing.TB, devs []*cuda.Device, name, src string, names ...string) []*cuda.Module {
	t.Helper()
	mods := make([]*cuda.Module, len(devs))
	for r, d := range devs {
		m, err := CompileKernel(context.Background(), d, name, src, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Unload() })
		for _, n := range names {
			if _, err := m.Function(n); err != nil {
				t.Fatal(err)
			}
		}
		mods[r] = m
	}
	return mods
}

func u32s(b []byte) []uint32 {
	v := make([]uint32, len(b)/4)
	for i := range v {
		v[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return v
}

// TestCUDAPeerAccess checks every way of reaching a peer's memory: plain
// copies from a peer's mapping (the owner wrote, the peer reads), device
// stores by a kernel into peers' buffers (the peers wrote, the owner
// reads, after a device barrier), and copy-engine copies into a peer's
// buffer ordered by stream signals. The device pointer arrays hold the
// addresses BufferPtrs and SignalPadPtrs report. Copies and signals go
// around the ring (to rank r+1, from rank r-1).
func TestCUDAPeerAccess(t *testing.T) {
	const n = 1 << 20
	devs, bes, pools := gpuPools(t, 0)
	world := len(devs)
	bufs, hs := allocAll(t, pools, n)
	for r := range world {
		for _, a := range []struct {
			dev  uintptr
			host []uintptr
		}{{hs[r].BufferPtrsDev(), hs[r].BufferPtrs()}, {hs[r].SignalPadPtrsDev(), hs[r].SignalPadPtrs()}} {
			raw := make([]byte, 8*world)
			if err := devs[r].CopyDtoH(raw, cuda.DevicePtr(a.dev)); err != nil {
				t.Fatal(err)
			}
			for q := range world {
				if got := uintptr(binary.LittleEndian.Uint64(raw[8*q:])); got != a.host[q] {
					t.Errorf("rank %d: device array entry %d is %#x, want %#x", r, q, got, a.host[q])
				}
			}
		}
		if bufs[r].Bytes() != nil || hs[r].PeerBytes(next(r, world)) != nil {
			t.Errorf("rank %d: host slices of device memory", r)
		}
	}

	// 1. The owner writes, the peer copies out of its mapping.
	checkErrs(t, onRanks(world, func(r int) error {
		if err := devs[r].CopyHtoD(cuda.DevicePtr(bufs[r].Addr()), bytes.Repeat([]byte{byte(r + 1)}, n)); err != nil {
			return err
		}
		if err := hs[r].Barrier(Now, 0, 0); err != nil {
			return err
		}
		got := make([]byte, n)
		for q := range world {
			if q == r {
				continue
			}
			if err := devs[r].CopyDtoH(got, cuda.DevicePtr(hs[r].Peer(q))); err != nil {
				return err
			}
			if !bytes.Equal(got, bytes.Repeat([]byte{byte(q + 1)}, n)) {
				return fmt.Errorf("rank %d reads rank %d's buffer wrong: %v...", r, q, got[:8])
			}
		}
		return hs[r].Barrier(Now, 0, 0)
	}))

	// 2. Device stores into peers' buffers, a device barrier, the owner
	// checks (in the kernel and from the host).
	mods := testModules(t, devs)
	ords := orderings(t, bes)
	checkErrs(t, onRanks(world, func(r int) error {
		// Memset8 returns once the memory is set (so do CopyHtoD and
		// CopyDtoH): no device-wide synchronize, which would wait for a
		// peer's kernel where ranks share one GPU.
		if err := devs[r].Memset8(cuda.DevicePtr(bufs[r].Addr()), 0, n); err != nil {
			return err
		}
		if err := hs[r].Barrier(Now, 0, 0); err != nil {
			return err
		}
		g, err := hs[r].KernelGroup(ords[r], 10*time.Second)
		if err != nil {
			return err
		}
		if err := mods[r].Launch("poke", cuda.Dim3(1), cuda.Dim3(256), 0, ords[r].Stream(), g); err != nil {
			return err
		}
		if err := ords[r].Synchronize(); err != nil {
			return err
		}
		raw := make([]byte, 4*(256*world+1))
		if err := devs[r].CopyDtoH(raw, cuda.DevicePtr(bufs[r].Addr())); err != nil {
			return err
		}
		v := u32s(raw)
		if v[256*world] != 0 {
			return fmt.Errorf("rank %d: the kernel counted %d wrong words", r, v[256*world])
		}
		for q := range world {
			for i := range 256 {
				if v[256*q+i] != uint32(1000*q+i) {
					return fmt.Errorf("rank %d: word %d of rank %d's slot is %d, want %d", r, i, q, v[256*q+i], 1000*q+i)
				}
			}
		}
		return hs[r].Barrier(Now, 0, 0)
	}))

	// 3. Copy-engine copies into the next rank's buffer, then put; that
	// rank waits in its stream and copies its buffer out.
	checkErrs(t, onRanks(world, func(r int) error {
		q, p := next(r, world), prev(r, world)
		src, err := devs[r].Alloc(n)
		if err != nil {
			return err
		}
		defer devs[r].Free(src)
		if err := devs[r].Memset8(src, byte(0x40+r), n); err != nil {
			return err
		}
		s := ords[r].Stream()
		if err := devs[r].CopyDtoDAsync(cuda.DevicePtr(hs[r].Peer(q)), src, n, s); err != nil {
			return err
		}
		if err := hs[r].PutSignal(ords[r], q, 1, 10*time.Second); err != nil {
			return err
		}
		if err := hs[r].WaitSignal(ords[r], p, 1, 10*time.Second); err != nil {
			return err
		}
		if err := ords[r].Synchronize(); err != nil {
			return err
		}
		got := make([]byte, n)
		if err := devs[r].CopyDtoH(got, cuda.DevicePtr(bufs[r].Addr())); err != nil {
			return err
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{byte(0x40 + p)}, n)) {
			return fmt.Errorf("rank %d: rank %d's copy into this buffer reads %#x...", r, p, got[:4])
		}
		return nil
	}))
}

// TestCUDAGraphSignals captures a step on every rank: a kernel bumps the
// rank's counter, a barrier, a kernel compares every peer's counter with
// its own (counting differences), then a put to every peer and a wait for
// every peer (a second barrier, built from put/wait: with fewer waits a
// rank could start the next round while a peer still checks this one).
// 100 replays must leave every counter at 100 and no difference seen:
// without the signals a rank would run ahead and read a counter of
// another round.
func TestCUDAGraphSignals(t *testing.T) {
	const replays = 100
	devs, bes, pools := gpuPools(t, 0)
	world := len(devs)
	bufs, hs := allocAll(t, pools, 4096)
	mods := testModules(t, devs)
	ords := orderings(t, bes)
	checkErrs(t, onRanks(world, func(r int) error {
		o, s := ords[r], ords[r].Stream()
		g, err := hs[r].KernelGroup(o, 10*time.Second)
		if err != nil {
			return err
		}
		if err := s.BeginCapture(); err != nil {
			return err
		}
		steps := []func() error{
			func() error { return mods[r].Launch("inc", cuda.Dim3(1), cuda.Dim3(32), 0, s, g) },
			func() error { return hs[r].Barrier(o, 0, 10*time.Second) },
			func() error { return mods[r].Launch("check", cuda.Dim3(1), cuda.Dim3(32), 0, s, g) },
		}
		for q := range world {
			if q != r {
				steps = append(steps, func() error { return hs[r].PutSignal(o, q, 1, 10*time.Second) })
			}
		}
		for q := range world {
			if q != r {
				steps = append(steps, func() error { return hs[r].WaitSignal(o, q, 1, 10*time.Second) })
			}
		}
		var serr error
		for _, st := range steps {
			if serr = st(); serr != nil {
				break
			}
		}
		graph, err := s.EndCapture()
		if err = errors.Join(serr, err); err != nil {
			return err
		}
		defer graph.Destroy()
		exec, err := graph.Instantiate()
		if err != nil {
			return err
		}
		defer exec.Destroy()
		for range replays {
			if err := exec.Launch(s); err != nil {
				return err
			}
		}
		if err := o.Synchronize(); err != nil {
			return err
		}
		raw := make([]byte, 8)
		if err := devs[r].CopyDtoH(raw, cuda.DevicePtr(bufs[r].Addr())); err != nil {
			return err
		}
		if v := u32s(raw); v[0] != replays || v[1] != 0 {
			return fmt.Errorf("rank %d: counter %d (want %d), %d rounds saw another counter", r, v[0], replays, v[1])
		}
		return nil
	}))
}

// TestCUDASignalTimeouts: a peer that never signals. A stream-ordered
// wait reports a TimeoutError naming the peer and the channel at
// Synchronize, within its deadline; later operations of that ordering
// return at once with the same report; Now reports its own timeouts
// (including a put into an unconsumed word) and starts afresh afterwards.
func TestCUDASignalTimeouts(t *testing.T) {
	const world = 2
	_, bes, pools := gpuPools(t, world)
	_, hs := allocAll(t, pools, 4096)
	o := orderings(t, bes)[0]
	const deadline = 300 * time.Millisecond
	start := time.Now()
	if err := hs[0].WaitSignal(o, 1, 3, deadline); err != nil {
		t.Fatal(err)
	}
	err := o.Synchronize()
	took := time.Since(start)
	var te *TimeoutError
	if !errors.As(err, &te) || !errors.Is(err, ErrTimeout) || te.Rank != 0 || te.Peer != 1 || te.Channel != 3 || te.Op != SignalWait || te.Consume {
		t.Fatalf("stream wait: %v; want a TimeoutError of rank 0 waiting for rank 1 on channel 3", err)
	}
	if te.Waited < deadline || took > deadline+5*time.Second {
		t.Errorf("waited %v (device), %v (host) for a %v deadline", te.Waited, took, deadline)
	}
	t.Logf("stream: %v (host %v)", err, took)

	// Sticky: the next operation does not wait again.
	start = time.Now()
	if err := hs[0].Barrier(o, 4, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := o.Synchronize(); !errors.As(err, &te) || te.Channel != 3 || time.Since(start) > 5*time.Second {
		t.Errorf("after a timeout: %v after %v; want the first report at once", err, time.Since(start))
	}

	// Now: its own timeouts, then a fresh start.
	err = hs[0].Barrier(Now, 5, deadline)
	if !errors.As(err, &te) || te.Peer != 1 || te.Channel != 5 || te.Op != SignalBarrier {
		t.Errorf("Now barrier: %v; want a TimeoutError naming rank 1 and channel 5", err)
	}
	if err := hs[0].PutSignal(Now, 1, 6, deadline); err != nil {
		t.Fatal(err)
	}
	err = hs[0].PutSignal(Now, 1, 6, deadline)
	if !errors.As(err, &te) || !te.Consume || te.Peer != 1 || te.Channel != 6 {
		t.Errorf("put into an unconsumed word: %v; want a TimeoutError with Consume", err)
	}
	if err := hs[1].WaitSignal(Now, 0, 6, 10*time.Second); err != nil {
		t.Errorf("rank 1 consuming rank 0's signal after rank 0's timeouts: %v", err)
	}
}

// TestCUDAAllReduceScale runs the worked example, testdata/allreduce_scale.cu
// (docs/symmetric-memory.md), on goroutine ranks. Every rank's set-up
// (inputs, output, kernel group) ends before any rank launches: where
// ranks share a GPU (one context), an allocation may wait for the
// context's kernels, and a peer's kernel already waits for this rank
// (reliability case 39); at world 4 on one H100 that held the barrier
// until its 10 s timeout about once in a few runs.
func TestCUDAAllReduceScale(t *testing.T) {
	const n, blocks = 1<<20 + 3, 8
	const scale = float32(0.5)
	devs, bes, pools := gpuPools(t, 0)
	world := len(devs)
	bufs, hs := allocAll(t, pools, 4*n)
	ords := orderings(t, bes)
	mods := loadKernels(t, devs, "allreduce_scale.cu", allReduceScaleSrc, "allreduce_scale")
	in := func(r, i int) float32 { return float32(r+1) * float32(i%1000) }
	outs := make([]cuda.DevicePtr, world)
	args := make([][]byte, world)
	t.Cleanup(func() {
		for r, out := range outs {
			if out != 0 {
				devs[r].Free(out)
			}
		}
	})
	checkErrs(t, onRanks(world, func(r int) error {
		d := devs[r]
		raw := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(in(r, i)))
		}
		if err := d.CopyHtoD(cuda.DevicePtr(bufs[r].Addr()), raw); err != nil {
			return err
		}
		out, err := d.Alloc(4 * n)
		if err != nil {
			return err
		}
		outs[r] = out
		g, err := hs[r].KernelGroup(ords[r], 10*time.Second)
		if err != nil {
			return err
		}
		a := make([]byte, 80)
		copy(a, g)
		binary.LittleEndian.PutUint64(a[56:], uint64(out))
		binary.LittleEndian.PutUint64(a[64:], n)
		binary.LittleEndian.PutUint32(a[72:], math.Float32bits(scale))
		binary.LittleEndian.PutUint32(a[76:], 8) // channels 8..15
		args[r] = a
		return nil
	}))
	if t.Failed() {
		return
	}
	checkErrs(t, onRanks(world, func(r int) error {
		d, mod := devs[r], mods[r]
		// Three launches in a row: the barriers' words reset themselves.
		for range 3 {
			if err := mod.Launch("allreduce_scale", cuda.Dim3(blocks), cuda.Dim3(256), 0, ords[r].Stream(), args[r]); err != nil {
				return err
			}
		}
		if err := ords[r].Synchronize(); err != nil {
			return err
		}
		raw := make([]byte, 4*n)
		if err := d.CopyDtoH(raw, outs[r]); err != nil {
			return err
		}
		for i := range n {
			var sum float32
			for q := range world {
				sum += in(q, i)
			}
			if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); got != sum*scale {
				return fmt.Errorf("rank %d: out[%d] = %v, want %v", r, i, got, sum*scale)
			}
		}
		return nil
	}))
}

// TestCUDAFreeWhilePeerMaps: rank 0 frees its buffer while rank 1 maps
// it (a same-process mapping of rank 0's allocation, with no reference of
// its own); rank 1 still reads what rank 0 wrote, and writes to it.
func TestCUDAFreeWhilePeerMaps(t *testing.T) {
	const n = 4 << 20
	devs, _, pools := gpuPools(t, 2)
	bufs, hs := allocAll(t, pools, n)
	if err := devs[0].Memset8(cuda.DevicePtr(bufs[0].Addr()), 0x5a, n); err != nil {
		t.Fatal(err)
	}
	checkErrs(t, onRanks(2, func(r int) error { return hs[r].Barrier(Now, 0, 0) }))
	if err := bufs[0].Free(); err != nil {
		t.Fatal(err)
	}
	p := cuda.DevicePtr(hs[1].Peer(0))
	got := make([]byte, n)
	if err := devs[1].CopyDtoH(got, p); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, n)) {
		t.Errorf("rank 0's memory after its Free reads %#x...", got[:4])
	}
	if err := devs[1].Memset8(p, 1, n); err != nil {
		t.Error(err)
	}
	if err := devs[1].Synchronize(); err != nil {
		t.Error(err)
	}
	if err := bufs[1].Free(); err != nil {
		t.Error(err)
	}
}

// TestCUDAPersistent: an id keeps its device address across Free, and the
// new allocation behind it is zeroed.
func TestCUDAPersistent(t *testing.T) {
	devs, _, pools := gpuPools(t, 1)
	d := devs[0]
	const n = 3 << 20
	b, err := pools[0].AllocPersistent(n, 7)
	if err != nil {
		t.Fatal(err)
	}
	addr := b.Addr()
	if err := d.Memset8(cuda.DevicePtr(addr), 0xee, n); err != nil {
		t.Fatal(err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	b2, err := pools[0].AllocPersistent(n, 7)
	if err != nil {
		t.Fatal(err)
	}
	if b2.Addr() != addr {
		t.Errorf("persistent id 7: %#x after Free, %#x before", b2.Addr(), addr)
	}
	got := make([]byte, n)
	if err := d.CopyDtoH(got, cuda.DevicePtr(b2.Addr())); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, n)) {
		t.Error("the new allocation under the id is not zeroed")
	}
}

// TestCUDAFreeAndCloseRelease: device memory returns to where it was once
// the pools are closed (within one granule), after a warm-up that loads
// what stays for the life of the process (context, modules).
func TestCUDAFreeAndCloseRelease(t *testing.T) {
	devs, bes := gpuRanks(t, 0)
	world := len(devs)
	cycle := func() {
		st := rendezvous.NewMemStore()
		group := uniqueGroup(t)
		checkErrs(t, onRanks(world, func(r int) error {
			p, err := NewPool(context.Background(), Config{Group: group, Rank: r, WorldSize: world, Store: st, Device: r, Backend: bes[r], Timeout: 20 * time.Second})
			if err != nil {
				return err
			}
			for i := range 3 {
				b, err := p.Alloc(16 << 20)
				if err != nil {
					return errors.Join(err, p.Close())
				}
				h, err := p.Rendezvous(context.Background(), b)
				if err == nil {
					err = h.Barrier(Now, 0, 0)
				}
				if err == nil && i == 0 {
					err = b.Free()
				}
				if err != nil {
					return errors.Join(err, p.Close())
				}
			}
			if _, err := p.AllocPersistent(5<<20, 1); err != nil {
				return errors.Join(err, p.Close())
			}
			return p.Close()
		}))
	}
	cycle()
	before := make([]uint64, world)
	for r, d := range devs {
		before[r], _, _ = d.MemInfo()
	}
	cycle()
	for r, d := range devs {
		after, _, err := d.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		if diff := int64(before[r]) - int64(after); diff > int64(bes[r].Granularity()) {
			t.Errorf("device %d: %d bytes free after, %d before: %d not returned", r, after, before[r], diff)
		}
	}
}

// Child mode of the process-rank GPU test (see proc_test.go): rank r on
// GPU r (cudatest.Ordinal) in its own process.
func init() {
	childModes["gpu-peers"] = func(rank, world int, st rendezvous.Store, group string) error {
		d, err := cuda.Open(cudatest.Ordinal(rank))
		if err != nil {
			return err
		}
		defer d.Close()
		be, err := NewCUDABackend(d, nil)
		if err != nil {
			return err
		}
		defer be.Close()
		fmt.Println("ready")
		return gpuProcRank(d, be, st, group, rank, world)
	}
}

// The victim of TestCUDAKilledRank: it writes its buffer, passes a
// barrier, says ready and waits to be killed.
func init() {
	childModes["gpu-victim"] = func(rank, world int, st rendezvous.Store, group string) error {
		d, err := cuda.Open(cudatest.Ordinal(rank))
		if err != nil {
			return err
		}
		be, err := NewCUDABackend(d, nil)
		if err != nil {
			return err
		}
		_, b, h, err := gpuProcSetup(d, be, st, group, rank, world, 1<<20)
		if err != nil {
			return err
		}
		if err := d.CopyHtoD(cuda.DevicePtr(b.Addr()), bytes.Repeat([]byte{0x77}, 1<<20)); err != nil {
			return err
		}
		if err := h.Barrier(Now, 0, 0); err != nil {
			return err
		}
		fmt.Println("ready")
		select {} // killed by the parent
	}
}

// gpuProcSetup forms a pool of process ranks on d, allocates n bytes and
// rendezvouses (the chunks travel as VMM descriptors over fdpass).
func gpuProcSetup(d *cuda.Device, be *CUDABackend, st rendezvous.Store, group string, rank, world, n int) (*Pool, *Buffer, *Handle, error) {
	p, err := NewPool(context.Background(), Config{Group: group, Rank: rank, WorldSize: world, Store: st, Device: d.Ordinal, Backend: be, Timeout: 30 * time.Second})
	if err != nil {
		return nil, nil, nil, err
	}
	b, err := p.Alloc(n)
	if err != nil {
		return nil, nil, nil, errors.Join(err, p.Close())
	}
	h, err := p.Rendezvous(context.Background(), b)
	if err != nil {
		return nil, nil, nil, errors.Join(err, p.Close())
	}
	return p, b, h, nil
}

// gpuProcRank is one process rank of TestCUDAProcessRanks: the pool, a
// rendezvous through descriptors, the owner writes and every peer reads,
// then Close.
func gpuProcRank(d *cuda.Device, be *CUDABackend, st rendezvous.Store, group string, rank, world int) error {
	const n = 1 << 20
	p, b, h, err := gpuProcSetup(d, be, st, group, rank, world, n)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := d.CopyHtoD(cuda.DevicePtr(b.Addr()), bytes.Repeat([]byte{byte(0x10 + rank)}, n)); err != nil {
		return err
	}
	if err := h.Barrier(Now, 0, 0); err != nil {
		return err
	}
	got := make([]byte, n)
	for q := range world {
		if err := d.CopyDtoH(got, cuda.DevicePtr(h.Peer(q))); err != nil {
			return err
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{byte(0x10 + q)}, n)) {
			return fmt.Errorf("rank %d reads rank %d's buffer as %#x...", rank, q, got[:4])
		}
	}
	if err := h.Barrier(Now, 0, 0); err != nil {
		return err
	}
	return b.Free()
}

// TestCUDAProcessRanks runs rank 0 here and every other rank in a child
// process: the chunks travel as VMM descriptors over fdpass (the path
// goroutine ranks skip, mapping each other directly).
func TestCUDAProcessRanks(t *testing.T) {
	devs, bes := gpuRanks(t, 0)
	world := len(devs)
	dir := filepath.Join(t.TempDir(), "store")
	group := uniqueGroup(t)
	kids := make([]*child, world)
	for r := 1; r < world; r++ {
		kids[r] = startChild(t, "gpu-peers", dir, group, r, world)
	}
	st, err := rendezvous.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := gpuProcRank(devs[0], bes[0], st, group, 0, world); err != nil {
		t.Error(err)
	}
	for r := 1; r < world; r++ {
		if err, out := kids[r].wait(t); err != nil || out != "ok" {
			t.Errorf("rank %d: %v: %s", r, err, out)
		}
	}
}

// next and prev are rank r's neighbours around the ring of world ranks
// (at world 2 both are the other rank).
func next(r, world int) int { return (r + 1) % world }
func prev(r, world int) int { return (r + world - 1) % world }

// BenchmarkCUDASignalGraph measures signals replayed from a CUDA graph on
// two GPUs. barrier and putwait: a graph of 100 stream-ordered barriers,
// or of 100 put/wait round trips (rank 0 puts and waits, rank 1 waits and
// puts back), replayed b.N times; the time per operation is one round trip
// between the GPUs plus a kernel node. kernel-barrier and kernel-putwait:
// one kernel node looping 100 device barriers (cg_symm_barrier) or
// put/wait round trips (cg_symm_put, cg_symm_wait), the protocol without a
// launch per operation. Compare with the flag floor (1.48 µs per round
// trip).
func BenchmarkCUDASignalGraph(b *testing.B) {
	for _, kind := range []string{"barrier", "putwait", "kernel-barrier", "kernel-putwait"} {
		b.Run(kind, func(b *testing.B) { benchSignalGraph(b, kind) })
	}
}

func benchSignalGraph(b *testing.B, kind string) {
	const world, ops = 2, 100
	if cudatest.Shared() {
		b.Skip("a round trip between two GPUs; with ranks sharing one it measures nothing of the links")
	}
	devs := cudatest.Devices(b, world)
	bes := make([]*CUDABackend, world)
	for r, d := range devs {
		be, err := NewCUDABackend(d, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer be.Close()
		bes[r] = be
	}
	st := rendezvous.NewMemStore()
	group := "bench-" + kind + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(groupSeq.Add(1), 10)
	pools := make([]*Pool, world)
	hs := make([]*Handle, world)
	checkB(b, onRanks(world, func(r int) error {
		p, err := NewPool(context.Background(), Config{Group: group, Rank: r, WorldSize: world, Store: st, Device: r, Backend: bes[r], Timeout: 20 * time.Second})
		if err != nil {
			return err
		}
		pools[r] = p
		buf, err := p.Alloc(4096)
		if err != nil {
			return err
		}
		hs[r], err = p.Rendezvous(context.Background(), buf)
		return err
	}))
	defer func() {
		for _, p := range pools {
			if p != nil {
				p.Close()
			}
		}
	}()
	mods := testModules(b, devs)
	execs := make([]*cuda.GraphExec, world)
	ords := make([]*StreamOrdering, world)
	checkB(b, onRanks(world, func(r int) error {
		s, err := devs[r].NewStream()
		if err != nil {
			return err
		}
		o, err := bes[r].NewStreamOrdering(s)
		if err != nil {
			return err
		}
		ords[r] = o
		group, err := hs[r].KernelGroup(o, 10*time.Second)
		if err != nil {
			return err
		}
		loop := make([]byte, 64) // struct loop_args
		copy(loop, group)
		binary.LittleEndian.PutUint32(loop[56:], ops)
		binary.LittleEndian.PutUint32(loop[60:], 2)
		if err := s.BeginCapture(); err != nil {
			return err
		}
		var serr error
		q := 1 - r
		for i := 0; i < ops && serr == nil; i++ {
			switch {
			case kind == "kernel-barrier":
				serr = mods[r].Launch("barrier_loop", cuda.Dim3(1), cuda.Dim3(32), 0, s, loop)
				i = ops
			case kind == "kernel-putwait":
				serr = mods[r].Launch("pingpong_loop", cuda.Dim3(1), cuda.Dim3(32), 0, s, loop)
				i = ops
			case kind == "barrier":
				serr = hs[r].Barrier(o, 0, 10*time.Second)
			case r == 0:
				if serr = hs[r].PutSignal(o, q, 1, 10*time.Second); serr == nil {
					serr = hs[r].WaitSignal(o, q, 1, 10*time.Second)
				}
			default:
				if serr = hs[r].WaitSignal(o, q, 1, 10*time.Second); serr == nil {
					serr = hs[r].PutSignal(o, q, 1, 10*time.Second)
				}
			}
		}
		g, err := s.EndCapture()
		if err = errors.Join(serr, err); err != nil {
			return err
		}
		defer g.Destroy()
		execs[r], err = g.Instantiate()
		if err != nil {
			return err
		}
		// Warm-up replay.
		if err := execs[r].Launch(s); err != nil {
			return err
		}
		return o.Synchronize()
	}))
	defer func() {
		for r, o := range ords {
			if o != nil {
				s := o.Stream()
				s.Synchronize()
				execs[r].Destroy()
				o.Close()
				s.Destroy()
			}
		}
	}()
	start, err := devs[0].NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	defer start.Destroy()
	end, err := devs[0].NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	defer end.Destroy()
	b.ResetTimer()
	checkB(b, onRanks(world, func(r int) error {
		s := ords[r].Stream()
		if r == 0 {
			if err := start.Record(s); err != nil {
				return err
			}
		}
		for range b.N {
			if err := execs[r].Launch(s); err != nil {
				return err
			}
		}
		if r == 0 {
			if err := end.Record(s); err != nil {
				return err
			}
		}
		return ords[r].Synchronize()
	}))
	b.StopTimer()
	ms, err := cuda.ElapsedMS(start, end)
	if err != nil {
		b.Fatal(err)
	}
	us := float64(ms) * 1000 / float64(b.N*ops)
	b.ReportMetric(us, "us/"+kind)
	b.Logf("%s: %.3f us per round trip inside a CUDA graph (%d replays of %d ops; flag floor 1.48 us)", kind, us, b.N, ops)
}

// checkB fails the benchmark for every non-nil error.
func checkB(b *testing.B, errs []error) {
	b.Helper()
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
}

// TestCUDAKilledRank: rank 1, a process on GPU 1 (cudatest.Ordinal), is SIGKILLed; rank 0's
// stream-ordered barrier then reports a TimeoutError naming rank 1 and the
// channel within its deadline, the dead rank's memory stays readable
// through rank 0's mapping (the mapping holds it), and Free and Close
// succeed.
func TestCUDAKilledRank(t *testing.T) {
	const world, victim = 2, 1
	devs, bes := gpuRanks(t, world)
	dir := filepath.Join(t.TempDir(), "store")
	group := uniqueGroup(t)
	kid := startChild(t, "gpu-victim", dir, group, victim, world)
	st, err := rendezvous.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, b, h, err := gpuProcSetup(devs[0], bes[0], st, group, 0, world, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := h.Barrier(Now, 0, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-kid.ready:
	case <-time.After(time.Minute):
		t.Fatal("the victim never became ready")
	}
	if err := kid.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	kid.wait(t)
	o := orderings(t, bes[:1])[0]
	const deadline = 2 * time.Second
	start := time.Now()
	if err := h.Barrier(o, 1, deadline); err != nil {
		t.Fatal(err)
	}
	err = o.Synchronize()
	var te *TimeoutError
	if !errors.As(err, &te) || te.Peer != victim || te.Channel != 1 || te.Rank != 0 {
		t.Errorf("barrier with a dead rank: %v; want a TimeoutError naming rank %d on channel 1", err, victim)
	}
	if took := time.Since(start); took > deadline+10*time.Second {
		t.Errorf("the barrier took %v for a %v deadline", took, deadline)
	}
	got := make([]byte, 1<<20)
	if err := devs[0].CopyDtoH(got, cuda.DevicePtr(h.Peer(victim))); err != nil {
		t.Errorf("reading the dead rank's memory: %v", err)
	} else if !bytes.Equal(got, bytes.Repeat([]byte{0x77}, 1<<20)) {
		t.Errorf("the dead rank's memory reads %#x...", got[:4])
	}
	if err := b.Free(); err != nil {
		t.Error(err)
	}
	if err := p.Close(); err != nil {
		t.Error(err)
	}
}

// TestSharedHint (reliability cases 34 and 39): a signal timeout where
// ranks of this process share the GPU with fewer than 32 hardware work
// queues names the variable (under MPS with 8, symm's goroutine ranks at
// world 4 timed out in TestCUDAGraphSignals, 2026-11-24); with 32, or
// queues not known (0), it names a peer's context-wide wait; on a GPU of
// one's own, no hint.
func TestSharedHint(t *testing.T) {
	if h := sharedHint(true, 8); !strings.Contains(h, "8 hardware work queues") || !strings.Contains(h, "CUDA_DEVICE_MAX_CONNECTIONS=32") {
		t.Errorf("shared, 8 queues: %q", h)
	}
	for _, c := range []struct {
		shared  bool
		queues  int
		context bool // the hint of a context-wide wait (case 39)
	}{{true, 32, true}, {true, 0, true}, {false, 8, false}, {false, 32, false}} {
		h := sharedHint(c.shared, c.queues)
		if got := strings.Contains(h, "case 39"); got != c.context || (!c.shared && h != "") || strings.Contains(h, "hardware work queues") {
			t.Errorf("shared %v, %d queues: hint %q", c.shared, c.queues, h)
		}
	}
	e := &TimeoutError{Op: SignalPut, Rank: 0, Peer: 1, Channel: 3, Waited: time.Second, Hint: sharedHint(true, 8)}
	if !strings.HasSuffix(e.Error(), "CUDA_DEVICE_MAX_CONNECTIONS=32") || !errors.Is(e, ErrTimeout) {
		t.Errorf("error with a hint: %v", e)
	}
}

// TestCUDAPersistentPeersStay: on every GPU rank, three rounds of
// AllocPersistent, Rendezvous and Free: BufferPtrs, SignalPadPtrs and the
// device arrays are the first round's every round, the device array holds
// them, and a copy through round 0's pointer to the next rank lands in
// that rank's new memory of the round.
func TestCUDAPersistentPeersStay(t *testing.T) {
	devs, _, pools := gpuPools(t, 0)
	world := len(devs)
	const n = 1 << 20
	first := make([][]uintptr, world)
	firstDev := make([]uintptr, world)
	for round := range 3 {
		bufs := make([]*Buffer, world)
		checkErrs(t, onRanks(world, func(r int) error {
			b, err := pools[r].AllocPersistent(n, 5)
			if err != nil {
				return err
			}
			h, err := pools[r].Rendezvous(context.Background(), b)
			if err != nil {
				return err
			}
			bufs[r] = b
			ptrs := append(h.BufferPtrs(), h.SignalPadPtrs()...)
			dev := make([]byte, 8*world)
			if err := devs[r].CopyDtoH(dev, cuda.DevicePtr(h.BufferPtrsDev())); err != nil {
				return err
			}
			for q := range world {
				if got := uintptr(binary.LittleEndian.Uint64(dev[8*q:])); got != h.BufferPtrs()[q] {
					return fmt.Errorf("round %d: device array[%d] = %#x, BufferPtrs %#x", round, q, got, h.BufferPtrs()[q])
				}
			}
			if round == 0 {
				first[r], firstDev[r] = ptrs, h.BufferPtrsDev()
			} else if !slices.Equal(ptrs, first[r]) || h.BufferPtrsDev() != firstDev[r] {
				return fmt.Errorf("round %d: pointers %x, device array %#x; round 0 had %x, %#x", round, ptrs, h.BufferPtrsDev(), first[r], firstDev[r])
			}
			return nil
		}))
		if t.Failed() {
			return
		}
		// Rank r writes round+r+1 into the next rank through round 0's
		// pointer; every rank reads its own buffer.
		checkErrs(t, onRanks(world, func(r int) error {
			next := (r + 1) % world
			src := bytes.Repeat([]byte{byte(16*round + r + 1)}, n)
			scratch, err := devs[r].Alloc(n)
			if err != nil {
				return err
			}
			defer devs[r].Free(scratch)
			if err := devs[r].CopyHtoD(scratch, src); err != nil {
				return err
			}
			if err := devs[r].CopyDtoD(cuda.DevicePtr(first[r][next]), scratch, n); err != nil {
				return err
			}
			return devs[r].Synchronize()
		}))
		checkErrs(t, onRanks(world, func(r int) error {
			prev := (r + world - 1) % world
			got := make([]byte, n)
			if err := devs[r].CopyDtoH(got, cuda.DevicePtr(bufs[r].Addr())); err != nil {
				return err
			}
			if want := byte(16*round + prev + 1); got[0] != want || got[n-1] != want {
				return fmt.Errorf("round %d: buffer holds %d..%d, want %d from rank %d", round, got[0], got[n-1], want, prev)
			}
			return nil
		}))
		checkErrs(t, onRanks(world, func(r int) error { return bufs[r].Free() }))
	}
}

// TestCUDANilArguments (no GPU needed): a nil device, a nil stream and a
// nil *StreamOrdering (one whose NewStreamOrdering failed) are refused
// with ErrInvalidArgument naming them. (Before, NewCUDABackend,
// KernelGroup and every signal operation given a nil ordering panicked
// with a nil dereference.)
func TestCUDANilArguments(t *testing.T) {
	be := &CUDABackend{} // its methods below reach no driver
	h := &Handle{ptrsDev: 1, rank: 0, world: 2, channels: 1, buf: &Buffer{pool: &Pool{be: be}}}
	var nilOrd *StreamOrdering
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"NewCUDABackend(nil)", func() error { _, err := NewCUDABackend(nil, nil); return err }},
		{"NewStreamOrdering(nil)", func() error { _, err := be.NewStreamOrdering(nil); return err }},
		{"KernelGroup(nil)", func() error { _, err := h.KernelGroup(nil, 0); return err }},
		{"Signal(nil ordering)", func() error {
			return be.Signal(nilOrd, &SignalOp{Kind: SignalPut, Peers: []int{1}, Put: []uintptr{1}})
		}},
		{"Signal(nil)", func() error { return be.Signal(nil, &SignalOp{Kind: SignalPut, Peers: []int{1}, Put: []uintptr{1}}) }},
	} {
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			err = c.call()
		}()
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v; want ErrInvalidArgument", c.name, err)
		}
	}
}
