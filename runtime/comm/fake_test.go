package comm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/symm"
)

// fakeDevice stands in for a GPU: it records launches and NCCL calls.
// Nothing runs. worldDevice completes it with the collective set-up calls.
type fakeDevice struct {
	rank int

	mu        sync.Mutex
	launches  []fakeLaunch
	nccl      []coll.Algorithm
	copies    []fakeCopy
	ncclOpen  bool // openNCCL was called
	released  bool
	nextSym   cuda.DevicePtr
	syms      []fakeSym
	statusVal uint64
	// syncErr is what synchronize returns (an NCCL timeout, say).
	syncErr error

	// preloaded are the kernels preload was given; preloadErr is what it
	// returns.
	preloaded  []*kernels.Kernel
	preloadErr error
	// bus, classifyFn and peersFn answer topology detection (detect.go);
	// zero values: a made-up bus id, no NVML, peer access to every GPU.
	bus        string
	busErr     error
	classifyFn func(ids []string) (classification, error)
	peersFn    func(ids []string) ([]int, error)
	// setups counts region set-ups (none when the GPUs use NCCL only).
	setups int
	// sms is the SM count smCount reports (0: 132).
	sms int
	// queues is what workQueues reports (0: 32, the most CUDA gives).
	queues int

	// hold, when set, makes launch signal entered and then wait for it to
	// be closed (the busy test).
	hold    chan struct{}
	entered chan struct{}
	// countOnly makes launch count launches (counted) instead of
	// recording them, so benchmarks measure the communicator alone.
	countOnly bool
	counted   int
	// early is what earlyLaunch answers (the device's support).
	early bool
	// store, when set, gets the keys a real device publishes: rank 0's
	// NCCL id (openNCCL) and this rank's IPC record (worldDevice's
	// setup), named as nccl.NewComm and ipc.Exchange name them.
	store rendezvous.Store
}

// fakeSym is one symmetric buffer of a fake device: at offset off of every
// rank's fake region. peers is its peer table, made once (as a real
// buffer's *symm.Handle is), so lookup allocates nothing.
type fakeSym struct {
	off, bytes cuda.DevicePtr
	peers      *fakePeers
}

// fakePeers is a fake symmetric buffer's peer table.
type fakePeers struct{ off cuda.DevicePtr }

func (p *fakePeers) Peer(r int) uintptr { return uintptr(fakeRegion(r) + p.off) }

// fakeLaunch is one recorded launch.
type fakeLaunch struct {
	kernel      *kernels.Kernel
	grid, block uint32
	args        []byte
	early       bool
}

// fakeRegion is rank r's made-up region base.
func fakeRegion(r int) cuda.DevicePtr { return cuda.DevicePtr(0x7000_0000_0000 + r<<32) }

func (d *fakeDevice) busID() (string, error) {
	if d.busErr != nil {
		return "", d.busErr
	}
	if d.bus != "" {
		return d.bus, nil
	}
	return fmt.Sprintf("0000:%02x:00.0", 0x10+d.rank), nil
}

func (d *fakeDevice) classify(ids []string) (classification, error) {
	if d.classifyFn != nil {
		return d.classifyFn(ids)
	}
	return classification{}, errors.New("fake: no libnvidia-ml.so.1")
}

func (d *fakeDevice) canAccessPeers(ids []string) ([]int, error) {
	if d.peersFn != nil {
		return d.peersFn(ids)
	}
	out := make([]int, len(ids))
	for i := range out {
		out[i] = peerYes
	}
	return out, nil
}

func (d *fakeDevice) ncclUnavailable() string { return "" }
func (d *fakeDevice) openNCCL(ctx context.Context, key string, rank, _ int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ncclOpen = true
	if d.store != nil && rank == 0 {
		return d.store.Set(ctx, key+"/nccl-id", make([]byte, 128))
	}
	return nil
}

func (d *fakeDevice) preload(_ context.Context, ks []*kernels.Kernel, _ []int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.preloaded = append(d.preloaded, ks...)
	return d.preloadErr
}

func (d *fakeDevice) earlyLaunch() bool { return d.early }

// workQueues is the fake context's work queues: d.queues, or 32.
func (d *fakeDevice) workQueues() int {
	if d.queues > 0 {
		return d.queues
	}
	return cuda.MaxWorkQueues
}

// smCount is the fake GPU's SMs: d.sms, or an H100's 132.
func (d *fakeDevice) smCount() int {
	if d.sms > 0 {
		return d.sms
	}
	return 132
}

func (d *fakeDevice) launch(k *kernels.Kernel, _ int, grid, block uint32, args []byte, _ *cuda.Stream, early bool) error {
	if d.hold != nil {
		d.entered <- struct{}{}
		<-d.hold
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.countOnly {
		d.counted++
		return nil
	}
	// Copy args, as cuLaunchKernel does: the caller reuses the buffer.
	d.launches = append(d.launches, fakeLaunch{k, grid, block, bytes.Clone(args), early})
	return nil
}

func (d *fakeDevice) runNCCL(cl *call, _ *cuda.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nccl = append(d.nccl, cl.alg)
	return nil
}

// fakeCopy is one recorded copy.
type fakeCopy struct {
	dst, src cuda.DevicePtr
	bytes    int64
}

func (d *fakeDevice) copy(dst, src cuda.DevicePtr, bytes int64, _ *cuda.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.copies = append(d.copies, fakeCopy{dst, src, bytes})
	return nil
}

func (d *fakeDevice) synchronize(*cuda.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.syncErr
}
func (d *fakeDevice) ncclError() error { return nil }
func (d *fakeDevice) status() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.statusVal
}
func (d *fakeDevice) cudaDevice() *cuda.Device { return nil }
func (d *fakeDevice) stream() *cuda.Stream     { return nil }
func (d *fakeDevice) release() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.released = true
	return nil
}

// worldDevice is a fakeDevice that knows the world size, so it can answer
// the collective set-up calls.
type worldDevice struct {
	*fakeDevice
	world int
}

func (d worldDevice) setup(ctx context.Context, key string, _, _ int64) ([]cuda.DevicePtr, cuda.DevicePtr, cuda.DevicePtr, error) {
	d.mu.Lock()
	d.setups++
	st := d.store
	d.mu.Unlock()
	if st != nil {
		if err := st.Set(ctx, fmt.Sprintf("%s/ipc/rank%d", key, d.rank), []byte("{}")); err != nil {
			return nil, 0, 0, err
		}
	}
	regions := make([]cuda.DevicePtr, d.world)
	for r := range regions {
		regions[r] = fakeRegion(r)
	}
	return regions, fakeRegion(d.rank) + 1<<30, fakeRegion(d.rank) + 2<<30, nil
}

func (d worldDevice) symmetric(_ context.Context, _ string, bytes int) (cuda.DevicePtr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	off := 3<<30 + d.nextSym
	d.nextSym += cuda.DevicePtr(bytes)
	d.syms = append(d.syms, fakeSym{off, cuda.DevicePtr(bytes), &fakePeers{off}})
	return fakeRegion(d.rank) + off, nil
}

func (d *fakeDevice) lookup(p cuda.DevicePtr, n int64) (zeroCopy, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.syms {
		base := fakeRegion(d.rank) + s.off
		if p >= base && p-base+cuda.DevicePtr(n) <= s.bytes {
			return zeroCopy{offset: int64(p - base), peers: s.peers}, true
		}
	}
	return zeroCopy{}, false
}

// fakeComms makes world goroutine-rank GPU communicators over fake devices.
func fakeComms(t testing.TB, world int, cfg Config) ([]*Communicator, []*fakeDevice) {
	t.Helper()
	devs := make([]*fakeDevice, world)
	for r := range devs {
		devs[r] = &fakeDevice{rank: r}
	}
	comms, errs := newFakeComms(t, cfg, devs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return comms, devs
}

// newFakeComms runs New on every rank over the given fake devices (one per
// rank) and returns each rank's communicator and error; tweaks change a
// rank's copy of cfg (ranks that disagree).
func newFakeComms(t testing.TB, cfg Config, devs []*fakeDevice, tweaks ...func(rank int, c *Config)) ([]*Communicator, []error) {
	t.Helper()
	world := len(devs)
	store := rendezvous.NewMemStore()
	if cfg.Library == nil {
		cfg.Library = collectives.Library
	}
	if cfg.Group == "" {
		cfg.Group = t.Name()
	}
	comms := make([]*Communicator, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg
			c.Rank, c.WorldSize, c.Device, c.Store = r, world, r, store
			for _, tweak := range tweaks {
				tweak(r, &c)
			}
			devs[r].store = c.Store
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			comms[r], errs[r] = newComm(ctx, c, func(Config) (device, error) { return worldDevice{devs[r], world}, nil })
		}()
	}
	wg.Wait()
	return comms, errs
}

// onRanks runs fn on every rank concurrently and returns the errors.
func onRanks(comms []*Communicator, fn func(r int, c *Communicator) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = fn(r, c) }()
	}
	wg.Wait()
	return errs
}

func closeAll(t testing.TB, comms []*Communicator) {
	t.Helper()
	if err := errors.Join(onRanks(comms, func(_ int, c *Communicator) error { return c.Close() })...); err != nil {
		t.Error(err)
	}
}

// TestFakeGPULaunch runs calls through the whole GPU path on fake devices:
// selection, the packed argument struct (decoded with the generated Go
// mirror of the C struct), grid sizing, NCCL hand-off, release.
func TestFakeGPULaunch(t *testing.T) {
	comms, devs := fakeComms(t, 2, Config{})
	const n = 3000 // bf16: 6000 bytes, oneshot_ll by the rules
	errs := onRanks(comms, func(r int, c *Communicator) error {
		if err := c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), n, coll.BF16, coll.Sum, Options{}); err != nil {
			return err
		}
		if err := c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), n, coll.BF16, coll.Sum, Options{Algorithm: coll.TwoShot}); err != nil {
			return err
		}
		// No f64 kernel: the rules' NCCL fallback.
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 64<<20, coll.F64, coll.Sum, Options{})
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	g := comms[1].gpu
	for r, d := range devs {
		if len(d.launches) != 2 || len(d.nccl) != 1 || d.nccl[0] != coll.NCCL {
			t.Fatalf("rank %d: %d launches, NCCL calls %v; want 2 launches and one NCCL call (f64)", r, len(d.launches), d.nccl)
		}
	}
	for i, want := range []string{"allreduce_oneshot_ll_bf16_sum_w2", "allreduce_twoshot_bf16_sum_w2"} {
		l := devs[1].launches[i]
		if l.kernel.Name != want {
			t.Fatalf("launch %d: kernel %s, want %s", i, l.kernel.Name, want)
		}
		var a collectives.ArgsW2
		if err := binary.Read(bytes.NewReader(l.args), binary.LittleEndian, &a); err != nil || len(l.args) != l.kernel.Args.Size {
			t.Fatalf("launch %d: %d argument bytes for a %d-byte struct: %v", i, len(l.args), l.kernel.Args.Size, err)
		}
		proto := coll.Protocol(l.kernel.Protocol)
		off := uint64(0)
		for _, p := range g.protocols {
			if p == proto {
				break
			}
			off += uint64(g.area[p])
		}
		id := -1
		for j := range collectives.Library.Kernels {
			if &collectives.Library.Kernels[j] == l.kernel {
				id = j
			}
		}
		chunk := chunkElems(&call{collective: coll.AllReduce, n: n, esize: 2}, 2, l.kernel)
		want := collectives.ArgsW2{Input: 0x1000, Output: 0x9000,
			Stage:   [2]uint64{uint64(fakeRegion(0)) + off, uint64(fakeRegion(1)) + off},
			Scratch: [2]uint64{uint64(fakeRegion(0)) + 2*uint64(g.slotBytes), uint64(fakeRegion(1)) + 2*uint64(g.slotBytes)},
			Signal: [2]uint64{uint64(fakeRegion(0)) + 2*uint64(g.slotBytes) + uint64(g.scratchBytes),
				uint64(fakeRegion(1)) + 2*uint64(g.slotBytes) + uint64(g.scratchBytes)},
			Seq: uint64(fakeRegion(1)) + 1<<30, Status: uint64(fakeRegion(1)) + 2<<30, Count: n, Chunk: uint64(chunk), Window: uint64(chunk),
			TimeoutNs: uint64(DefaultTimeout), SlotBytes: uint64(g.slotBytes), Rank: 1, KernelId: int32(id)}
		if a != want {
			t.Errorf("launch %d: arguments\n%+v\nwant\n%+v", i, a, want)
		}
		units := 2 * l.kernel.ThreadUnits(chunk, 2)
		blocks, threads := l.kernel.Launch.Block(units)
		if l.grid != uint32(blocks) || l.block != uint32(threads) {
			t.Errorf("launch %d: grid %d x %d, want %d x %d", i, l.grid, l.block, blocks, threads)
		}
	}
	closeAll(t, comms)
	for r, d := range devs {
		if !d.released {
			t.Errorf("rank %d: Close did not release the device", r)
		}
	}
	if err := comms[0].AllReduce(DeviceBuffer(1), DeviceBuffer(1), 1, coll.F32, coll.Sum, Options{}); !errors.Is(err, ErrClosed) {
		t.Errorf("call after Close: %v, want ErrClosed", err)
	}
}

// TestFakeGPUBusy checks the rule for two goroutines on one GPU
// communicator: the second gets ErrBusy at once (no wait, no shared
// counters), and the communicator works afterwards.
func TestFakeGPUBusy(t *testing.T) {
	comms, devs := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	d := devs[0]
	d.hold, d.entered = make(chan struct{}), make(chan struct{})
	first := make(chan error)
	go func() {
		first <- comms[0].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 64, coll.F32, coll.Sum, Options{})
	}()
	<-d.entered
	start := time.Now()
	err := comms[0].AllGather(DeviceBuffer(0x1000), DeviceBuffer(0x2000), 64, coll.F32, Options{})
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "another goroutine") {
		t.Errorf("second goroutine: %v, want ErrBusy", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("ErrBusy took %v", el)
	}
	close(d.hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	d.hold = nil
	if err := comms[0].AllGather(DeviceBuffer(0x1000), DeviceBuffer(0x2000), 64, coll.F32, Options{}); err != nil {
		t.Errorf("after the first call returned: %v", err)
	}
	if len(d.launches) != 2 {
		t.Errorf("%d launches, want 2", len(d.launches))
	}
}

// TestFakeMaxBlocks: Config.MaxBlocks caps every launch's grid (blocks
// of min_threads kernels grow to hold the work instead), changes nothing
// where the kernel's own cap is lower, must agree across ranks (else New
// fails on every rank naming both values, with nothing launched) and may
// not be negative; ranks sharing a GPU get a cap without it.
func TestFakeMaxBlocks(t *testing.T) {
	const n = 8 << 20 // f32, 32 MiB: every kernel's own grid is at its cap
	algs := []coll.Algorithm{coll.OneShot, coll.TwoShot, coll.OneShotLL128}
	launch := func(cfg Config) []fakeLaunch {
		comms, devs := fakeComms(t, 2, cfg)
		defer closeAll(t, comms)
		if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
			for _, a := range algs {
				if err := c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), n, coll.F32, coll.Sum, Options{Algorithm: a}); err != nil {
					return err
				}
			}
			return nil
		})...); err != nil {
			t.Fatal(err)
		}
		return devs[0].launches
	}
	uncapped := launch(Config{StagingBytes: 64 << 20})
	for _, cap := range []int{1, 5, 1000} {
		capped := launch(Config{StagingBytes: 64 << 20, MaxBlocks: cap})
		if len(capped) != len(uncapped) {
			t.Fatalf("MaxBlocks %d: %d launches, want %d", cap, len(capped), len(uncapped))
		}
		for i, l := range capped {
			u := uncapped[i]
			want := min(u.grid, uint32(cap))
			if l.grid != want || l.kernel != u.kernel {
				t.Errorf("MaxBlocks %d: %s launched %d blocks, want %d (uncapped %d)", cap, l.kernel.Name, l.grid, want, u.grid)
			}
			if l.block < u.block || l.block > uint32(l.kernel.Launch.Threads) {
				t.Errorf("MaxBlocks %d: %s launched blocks of %d threads, want %d to %d", cap, l.kernel.Name, l.block, u.block, l.kernel.Launch.Threads)
			}
		}
	}
	for i, l := range uncapped {
		if l.grid <= 5 {
			t.Errorf("launch %d (%s): uncapped grid %d; the test needs grids above 5", i, l.kernel.Name, l.grid)
		}
	}

	devs := []*fakeDevice{{rank: 0}, {rank: 1}}
	comms, errs := newFakeComms(t, Config{}, devs, func(r int, c *Config) { c.MaxBlocks = 8 * (r + 1) })
	for _, c := range comms {
		if c != nil {
			c.Close()
		}
	}
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "Config.MaxBlocks") || !strings.Contains(err.Error(), "8") || !strings.Contains(err.Error(), "16") {
			t.Errorf("rank %d: %v, want ErrMismatch naming MaxBlocks 8 and 16", r, err)
		}
		if len(devs[r].launches) != 0 || devs[r].setups != 0 {
			t.Errorf("rank %d set up or launched despite the mismatch", r)
		}
	}

	// Ranks sharing GPUs: with MaxBlocks 0, grids of at most the SMs over
	// the most ranks on one GPU, the least such cap of any rank; an
	// explicit MaxBlocks wins.
	for _, tc := range []struct{ maxBlocks, want int }{{0, 65}, {10, 10}} {
		devs := make([]*fakeDevice, 4)
		for r := range devs {
			devs[r] = &fakeDevice{rank: r, bus: fmt.Sprintf("0000:%02x:00.0", 0x10+r/2), sms: 132}
		}
		devs[3].sms = 130 // 65 per rank of the two on its GPU
		comms, errs := newFakeComms(t, Config{StagingBytes: 64 << 20, MaxBlocks: tc.maxBlocks}, devs)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
			return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), n, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
		})...); err != nil {
			t.Fatal(err)
		}
		closeAll(t, comms)
		for r, d := range devs {
			if len(d.launches) != 1 || d.launches[0].grid != uint32(tc.want) {
				t.Errorf("two ranks per GPU, MaxBlocks %d: rank %d launched %+v, want one grid of %d", tc.maxBlocks, r, d.launches, tc.want)
			}
		}
	}

	_, err := New(context.Background(), Config{Library: collectives.Library, WorldSize: 1, Store: rendezvous.NewMemStore(), MaxBlocks: -1})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "MaxBlocks -1") {
		t.Errorf("MaxBlocks -1: %v, want ErrInvalidArgument naming it", err)
	}
}

// TestStagingSizesChecked: a negative StagingBytes or StagingBudget (which
// meant the default before), or one past MaxStagingBytes (whose region
// size overflowed), is refused by New before anything is set up.
func TestStagingSizesChecked(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{StagingBytes: -1}, "StagingBytes -1"},
		{Config{StagingBudget: -5}, "StagingBudget -5"},
		{Config{StagingBytes: 1 << 62}, "StagingBytes 4611686018427387904"},
		{Config{StagingBudget: MaxStagingBytes + 1}, "StagingBudget 1099511627777"},
	} {
		c.cfg.Library, c.cfg.WorldSize, c.cfg.Store = collectives.Library, 1, rendezvous.NewMemStore()
		if _, err := New(context.Background(), c.cfg); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument naming it", c.want, err)
		}
	}
	// The bound itself is accepted (the fake device allocates nothing).
	comms, _ := fakeComms(t, 2, Config{StagingBytes: MaxStagingBytes})
	defer closeAll(t, comms)
	// Alloc's size: positive, at most symm.MaxAllocBytes (a larger one
	// overflowed the pool's chunk arithmetic into a negative size).
	for _, n := range []int{0, -1, symm.MaxAllocBytes + 1, math.MaxInt} {
		if _, err := comms[0].Alloc(context.Background(), n); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprintf("Alloc of %d bytes", n)) {
			t.Errorf("Alloc(%d): %v, want ErrInvalidArgument naming the size", n, err)
		}
	}
}

// TestFakeGPUDebugCheck runs the debug check mode on the GPU path: a
// symmetric input on one rank only (zero-copy there, staged elsewhere) is
// named before anything launches.
func TestFakeGPUDebugCheck(t *testing.T) {
	t.Setenv(EnvDebugCheck, "1")
	comms, devs := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	syms := allocOnRanks(t, comms, 1<<20)
	errs := onRanks(comms, func(r int, c *Communicator) error {
		in := DeviceBuffer(0x1000)
		if r == 1 {
			in = DeviceBuffer(syms[1] + 4096)
		}
		return c.AllReduce(in, DeviceBuffer(0x9000), 1<<15, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "rank 1 issued allreduce of 32768 f32 sum, algorithm oneshot (runs oneshot), zero-copy at offset 4096") {
			t.Errorf("rank %d: %v, want ErrMismatch naming rank 1's zero-copy input", r, err)
		}
	}
	for r, d := range devs {
		if len(d.launches) != 0 {
			t.Errorf("rank %d launched %d kernels despite the mismatch", r, len(d.launches))
		}
	}
	// Both symmetric at the same offset: zero-copy on both, and it runs.
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		return c.AllReduce(DeviceBuffer(syms[r]+4096), DeviceBuffer(0x9000), 1<<15, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
	})...); err != nil {
		t.Fatal(err)
	}
	var a collectives.ArgsW2
	binary.Read(bytes.NewReader(devs[0].launches[0].args), binary.LittleEndian, &a)
	if a.SlotBytes != 0 || a.Stage[1] != uint64(fakeRegion(1))+3<<30+4096 {
		t.Errorf("zero-copy launch: slot bytes %d, stage %x; want 0 and rank 1's symmetric input", a.SlotBytes, a.Stage)
	}
}

// TestFakeGPUTimeoutStatus checks that a status word a kernel wrote comes
// back as a *TimeoutError matching ErrTimeout, and that it sticks.
func TestFakeGPUTimeoutStatus(t *testing.T) {
	diagnoseFor(t, 50*time.Millisecond) // rank 1 is not waiting
	comms, devs := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	id := 5
	devs[0].statusVal = uint64(id)<<48 | 3<<32 | 2<<24 | 1<<16 | 0<<8 | 1
	err := comms[0].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 64, coll.F32, coll.Sum, Options{})
	var te *TimeoutError
	if !errors.As(err, &te) || !errors.Is(err, ErrTimeout) || te.Peer != 1 || te.Barrier != 2 || te.Block != 3 || te.Kernel != collectives.Library.Kernels[id].Name {
		t.Fatalf("got %v (%+v)", err, te)
	}
	devs[0].statusVal = 0
	if err := comms[0].Err(); !errors.Is(err, ErrTimeout) {
		t.Errorf("the communicator forgot its timeout: %v", err)
	}
	if len(devs[0].launches) != 0 {
		t.Errorf("launched on a broken communicator")
	}
}

// TestFakeEarlyLaunch: kernels are launched early (programmatic dependent
// launch) exactly where the device supports it, Config.NoEarlyLaunch is
// unset and no other rank shares its context (there the early blocks could
// take a peer's SMs: reliability case 97); a rank decides alone, so
// ranks that differ still run.
func TestFakeEarlyLaunch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		support []bool // per rank: what the device says
		off     bool   // Config.NoEarlyLaunch
	}{
		{"supported", []bool{true, true}, false},
		{"turned off", []bool{true, true}, true},
		{"unsupported", []bool{false, false}, false},
		{"one rank without", []bool{true, false}, false},
		{"ranks sharing a GPU", []bool{true, true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs := []*fakeDevice{{rank: 0, early: tc.support[0]}, {rank: 1, early: tc.support[1]}}
			shared := tc.name == "ranks sharing a GPU"
			if shared {
				devs[0].bus, devs[1].bus = "0000:10:00.0", "0000:10:00.0"
			}
			comms, errs := newFakeComms(t, Config{NoEarlyLaunch: tc.off}, devs)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			defer closeAll(t, comms)
			errs = onRanks(comms, func(r int, c *Communicator) error {
				return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 512, coll.BF16, coll.Sum, Options{})
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for r, d := range devs {
				if len(d.launches) != 1 {
					t.Fatalf("rank %d: %d launches, want 1", r, len(d.launches))
				}
				if want := tc.support[r] && !tc.off && !shared; d.launches[0].early != want {
					t.Errorf("rank %d: early launch %v, want %v (device support %v, NoEarlyLaunch %v, GPU shared %v)", r, d.launches[0].early, want, tc.support[r], tc.off, shared)
				}
			}
		})
	}
}

// TestFakeHCMScratchHoldsAccumulators: the hybrid-cube-mesh all-reduce
// keeps its quad partials in f32 (kernels.Kernel.ScratchAcc), so a bf16
// message's windows are sized for 4-byte scratch elements: the same
// window as f32's (not twice it), and every window's chunks fit the
// scratch area as f32; two-shot's scratch holds bf16 (twice the window).
func TestFakeHCMScratchHoldsAccumulators(t *testing.T) {
	comms, devs := fakeComms(t, 8, Config{Topology: "hcm8", StagingBytes: 1 << 20})
	defer closeAll(t, comms)
	const n = 4 << 20 // elements: larger than any window here
	calls := []struct {
		alg coll.Algorithm
		dt  coll.DType
	}{{coll.HCM, coll.BF16}, {coll.HCM, coll.F32}, {coll.TwoShot, coll.BF16}, {coll.TwoShot, coll.F32}}
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		for _, cl := range calls {
			if err := c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), n, cl.dt, coll.Sum, Options{Algorithm: cl.alg}); err != nil {
				return err
			}
		}
		return nil
	})...); err != nil {
		t.Fatal(err)
	}
	g := comms[0].gpu
	windows := make([]uint64, len(calls))
	for i, l := range devs[0].launches {
		var a collectives.ArgsW8
		if err := binary.Read(bytes.NewReader(l.args), binary.LittleEndian, &a); err != nil {
			t.Fatal(err)
		}
		windows[i] = a.Window
		elem := l.kernel.ScratchElemBytes(calls[i].dt)
		if a.Window == 0 || a.Window >= n/8 || a.Window*8*uint64(elem) > uint64(g.scratchBytes) {
			t.Errorf("%s %s: window %d elements; want rounds whose 8 chunks of %d-byte scratch elements fit %d bytes", calls[i].alg, calls[i].dt, a.Window, elem, g.scratchBytes)
		}
	}
	if windows[0] != windows[1] {
		t.Errorf("hcm windows: bf16 %d, f32 %d elements; want equal (both f32 in scratch)", windows[0], windows[1])
	}
	if windows[2] <= windows[3] {
		t.Errorf("two-shot windows: bf16 %d, f32 %d elements; want bf16's larger (bf16 in scratch)", windows[2], windows[3])
	}
}

// TestFakeConfigsAgree: ranks whose staging layouts differ with the same
// total (a StagingBytes that happens to sum like the default areas), or
// whose Config.NCCLWindows differ, fail New with ErrMismatch naming both.
// (Before, only the total was compared: kernels then addressed peers'
// areas at other offsets; and a rank alone with NCCLWindows entered a
// collective window registration no peer joined.)
func TestFakeConfigsAgree(t *testing.T) {
	devs := make([]*fakeDevice, 4)
	for r := range devs {
		devs[r] = &fakeDevice{rank: r}
	}
	// The default layout at world 4, and one StagingBytes giving every
	// area the same size with the same slot total.
	probe, _ := fakeComms(t, 4, Config{})
	g := probe[0].gpu
	total, areas := g.slotBytes, len(g.protocols)
	closeAll(t, probe)
	if total%int64(areas) != 0 || total/int64(areas)%regionAlign != 0 {
		t.Skipf("default slot of %d bytes over %d areas has no equal split", total, areas)
	}
	comms, errs := newFakeComms(t, Config{}, devs, func(r int, c *Config) {
		if r == 1 {
			c.StagingBytes = total / int64(areas)
		}
	})
	for r, err := range errs {
		if comms[r] != nil {
			comms[r].Close()
		}
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "StagingBudget") {
			t.Errorf("layouts with one total, rank %d: %v; want ErrMismatch naming the staging Configs", r, err)
		}
	}
	devs2 := []*fakeDevice{{rank: 0}, {rank: 1}}
	comms, errs = newFakeComms(t, Config{}, devs2, func(r int, c *Config) { c.NCCLWindows = r == 0 })
	for r, err := range errs {
		if comms[r] != nil {
			comms[r].Close()
		}
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "NCCLWindows") {
			t.Errorf("NCCLWindows on rank 0 only, rank %d: %v; want ErrMismatch naming it", r, err)
		}
	}
}

// TestFakeStagingBudgetFloor: a StagingBudget below what the areas need at
// least is refused, naming that floor (before, it was exceeded silently:
// 1 MiB gave a 13.5 MiB region at world 2); the floor itself is accepted
// and the region then fits it.
func TestFakeStagingBudgetFloor(t *testing.T) {
	devs := []*fakeDevice{{rank: 0}, {rank: 1}}
	_, errs := newFakeComms(t, Config{StagingBudget: 1 << 20}, devs)
	var floor int64
	for r, err := range errs {
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "StagingBudget 1048576 is below the ") {
			t.Fatalf("rank %d: %v; want ErrInvalidArgument naming the floor", r, err)
		}
		fmt.Sscanf(err.Error()[strings.Index(err.Error(), "below the ")+len("below the "):], "%d", &floor)
	}
	comms, _ := fakeComms(t, 2, Config{StagingBudget: floor})
	defer closeAll(t, comms)
	g := comms[0].gpu
	if region := 2*g.slotBytes + g.scratchBytes + g.signalBytes(); region > floor {
		t.Errorf("budget %d: region of %d bytes", floor, region)
	}
}

// TestFakeHierarchicalOnOneHost: forcing the hierarchical algorithm on a
// group within one host is ErrUnsupported saying it is for groups that
// span hosts (it advised adding a kernel to the spec).
func TestFakeHierarchicalOnOneHost(t *testing.T) {
	comms, _ := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	_, err := comms[0].Explain(coll.AllReduce, DeviceBuffer(0x1000), DeviceBuffer(0x2000), 64, coll.F32, coll.Sum, Options{Algorithm: coll.Hierarchical})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "span hosts") {
		t.Errorf("forced hierarchical on one host: %v; want ErrUnsupported saying it spans hosts", err)
	}
}

// TestFakeMultiHostRulesAgree: ranks passing different
// Config.MultiHostRules fail New with ErrMismatch (a group spanning hosts
// selects by them, and ranks must choose alike); equal rules pass.
func TestFakeMultiHostRulesAgree(t *testing.T) {
	rules := map[coll.Collective][]kernels.Rule{coll.AllReduce: {{UpTo: 1 << 20, Use: coll.Hierarchical}, {Use: coll.NCCL}}}
	devs := []*fakeDevice{{rank: 0}, {rank: 1}}
	comms, errs := newFakeComms(t, Config{}, devs, func(r int, c *Config) {
		if r == 1 {
			c.MultiHostRules = rules
		}
	})
	for r, err := range errs {
		if comms[r] != nil {
			comms[r].Close()
		}
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "MultiHostRules") {
			t.Errorf("rank %d: %v; want ErrMismatch naming Config.MultiHostRules", r, err)
		}
	}
	comms, _ = fakeComms(t, 2, Config{MultiHostRules: rules})
	closeAll(t, comms)
}

// TestFakeSharedGPUWithoutNCCL: ranks sharing a GPU never open NCCL (it
// refuses two ranks of a communicator on one GPU, so New failed there
// unless Config.DisableNCCL was set): New succeeds on every rank, the
// generated kernels run, and a size the rules give to NCCL is refused
// with the reason. With a GPU per rank NCCL opens as before.
func TestFakeSharedGPUWithoutNCCL(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			devs := make([]*fakeDevice, 3)
			for r := range devs {
				devs[r] = &fakeDevice{rank: r, bus: fmt.Sprintf("0000:%02x:00.0", 0x10+r), sms: 132}
				if shared {
					devs[r].bus = "0000:10:00.0"
				}
			}
			comms, errs := newFakeComms(t, Config{}, devs)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			defer closeAll(t, comms)
			for r, d := range devs {
				if d.ncclOpen == shared {
					t.Errorf("rank %d: NCCL opened %v with the GPU shared %v", r, d.ncclOpen, shared)
				}
			}
			errs = onRanks(comms, func(r int, c *Communicator) error {
				return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 512, coll.BF16, coll.Sum, Options{})
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("a small all-reduce: %v", err)
			}
			_, err := comms[0].Choose(coll.AllReduce, 1<<40, coll.BF16, coll.Sum)
			switch {
			case shared && (!errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "ranks share a GPU")):
				t.Errorf("a size the rules give to NCCL, GPU shared: %v, want ErrUnsupported naming the shared GPU", err)
			case !shared && err != nil:
				t.Errorf("a size the rules give to NCCL, a GPU per rank: %v", err)
			}
		})
	}
}
