package comm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/alloc"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// eventLog is one ordered log shared by fake registrars and fake allocator
// drivers, so tests see registration calls and driver frees in one order.
type eventLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *eventLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *eventLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// since returns the lines after the first n.
func (l *eventLog) since(n int) []string { return l.all()[n:] }

// regDevice is a fake GPU with a fake NCCL registrar and the aborter.
type regDevice struct {
	worldDevice
	name string // "A0": group A, rank 0
	log  *eventLog

	// noWin and noReg, when set, play an NCCL without windows or buffer
	// registration (noWindows, noRegister).
	noWin, noReg string

	mu      sync.Mutex
	next    uintptr
	refuse  map[cuda.DevicePtr]string
	stuck   chan struct{}  // non-nil: synchronize waits until releaseKernels closes it
	waiting chan struct{}  // signalled when synchronize starts waiting on stuck
	abortAt cuda.DevicePtr // the word releaseKernels raised
	// regionFreed is closed when the region releaseKeepingRegion kept is
	// freed.
	regionFreed chan struct{}
	// coll, when set, makes registerWindow collective as NCCL's is
	// (fakeWindowNCCL); wins counts this rank's window registrations.
	coll *fakeWindowNCCL
	wins int
}

// fakeWindowNCCL plays ncclCommWindowRegister's collectiveness on a
// blocking communicator, for a group of regDevices: a rank's n-th window
// registration waits, without bound, until every rank has made its n-th,
// or until some rank's NCCL communicator is aborted (in NCCL that closes
// the connections the waiting ranks read from, and their calls fail).
type fakeWindowNCCL struct {
	world int

	mu      sync.Mutex
	arrived map[int]int
	done    map[int]chan struct{}
	aborted chan struct{}
	once    sync.Once
}

func newFakeWindowNCCL(world int) *fakeWindowNCCL {
	return &fakeWindowNCCL{world: world, arrived: map[int]int{}, done: map[int]chan struct{}{}, aborted: make(chan struct{})}
}

// register is a rank's n-th registration.
func (f *fakeWindowNCCL) register(n int) error {
	f.mu.Lock()
	if f.done[n] == nil {
		f.done[n] = make(chan struct{})
	}
	ch := f.done[n]
	if f.arrived[n]++; f.arrived[n] == f.world {
		close(ch)
	}
	f.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-f.aborted:
		return errors.New("fake NCCL: a peer's communicator was aborted (connection closed by remote peer)")
	}
}

func (f *fakeWindowNCCL) abort() { f.once.Do(func() { close(f.aborted) }) }

func (d *regDevice) checkMemory(p cuda.DevicePtr, bytes int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if why, ok := d.refuse[p]; ok {
		return errorf(ErrInvalidArgument, "comm: register %#x: %s", uintptr(p), why)
	}
	return nil
}

// handle makes the next handle and logs "<name> <what> <p> <bytes> -> h<n>".
func (d *regDevice) handle(what string, p cuda.DevicePtr, bytes int64) (uintptr, error) {
	d.mu.Lock()
	d.next++
	h := d.next
	d.mu.Unlock()
	d.log.add("%s %s %#x %d -> h%d", d.name, what, uintptr(p), bytes, h)
	return h, nil
}

func (d *regDevice) register(p cuda.DevicePtr, bytes int64) (uintptr, error) {
	return d.handle("register", p, bytes)
}

func (d *regDevice) deregister(h uintptr) error {
	d.log.add("%s deregister h%d", d.name, h)
	return nil
}

func (d *regDevice) registerWindow(p cuda.DevicePtr, bytes int64) (uintptr, error) {
	if d.coll != nil {
		d.mu.Lock()
		d.wins++
		n := d.wins
		d.mu.Unlock()
		d.log.add("%s window wait %d", d.name, n)
		if err := d.coll.register(n); err != nil {
			return 0, err
		}
	}
	return d.handle("window", p, bytes)
}

func (d *regDevice) noWindows() string  { return d.noWin }
func (d *regDevice) noRegister() string { return d.noReg }

func (d *regDevice) deregisterWindow(h uintptr) error {
	d.log.add("%s window deregister h%d", d.name, h)
	return nil
}

func (d *regDevice) synchronize(*cuda.Stream) error {
	d.mu.Lock()
	stuck := d.stuck
	d.mu.Unlock()
	if stuck == nil {
		return nil
	}
	d.waiting <- struct{}{}
	<-stuck
	// What a real device reports once its wait is cut short.
	return errorf(ErrAborted, "fake: wait cut short by abort")
}

func (d *regDevice) releaseKernels(abortWord cuda.DevicePtr) error {
	d.log.add("%s release kernels", d.name)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.abortAt = abortWord
	if d.stuck != nil {
		close(d.stuck)
		d.stuck = nil
	}
	return nil
}

func (d *regDevice) abortNCCL() error {
	d.log.add("%s nccl abort", d.name)
	if d.coll != nil {
		d.coll.abort()
	}
	return nil
}

func (d *regDevice) drained(time.Duration) bool { return true }

func (d *regDevice) release() error {
	d.log.add("%s release", d.name)
	return d.fakeDevice.release()
}

func (d *regDevice) releaseKeepingRegion() (func() error, error) {
	err := d.release()
	freed := make(chan struct{})
	d.mu.Lock()
	d.regionFreed = freed
	d.mu.Unlock()
	return func() error {
		d.log.add("%s free region", d.name)
		close(freed)
		return nil
	}, err
}

var _ aborter = (*regDevice)(nil)

// fakeAllocDriver is an alloc.Driver logging into the shared log.
type fakeAllocDriver struct {
	name string
	log  *eventLog
	next cuda.DevicePtr
}

func (f *fakeAllocDriver) Alloc(bytes int64) (cuda.DevicePtr, error) {
	if f.next == 0 {
		f.next = 0x5000_0000_0000
	}
	p := f.next
	f.next += cuda.DevicePtr(bytes)
	f.log.add("%s driver alloc %#x %d", f.name, uintptr(p), bytes)
	return p, nil
}

func (f *fakeAllocDriver) Free(p cuda.DevicePtr) error {
	f.log.add("%s driver free %#x", f.name, uintptr(p))
	return nil
}

func (f *fakeAllocDriver) Record(*cuda.Stream) (alloc.Event, error) {
	return nil, errors.New("fake: no events")
}

// regComms forms one group of world ranks on regDevices named
// group+rank; allocs[r] (may be nil) is rank r's Config.Allocator.
func regComms(t *testing.T, store rendezvous.Store, group string, world int, log *eventLog, allocs []*alloc.Allocator) ([]*Communicator, []*regDevice) {
	return regCommsWith(t, store, Config{Group: group}, world, log, allocs)
}

// regCommsWith is regComms with more of the Config (Group names the
// devices); edits change each fake device before New.
func regCommsWith(t *testing.T, store rendezvous.Store, base Config, world int, log *eventLog, allocs []*alloc.Allocator, edits ...func(*regDevice)) ([]*Communicator, []*regDevice) {
	group := base.Group
	t.Helper()
	comms := make([]*Communicator, world)
	devs := make([]*regDevice, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		devs[r] = &regDevice{worldDevice: worldDevice{&fakeDevice{rank: r}, world}, name: fmt.Sprintf("%s%d", group, r), log: log,
			refuse: map[cuda.DevicePtr]string{}, waiting: make(chan struct{}, 1)}
		for _, e := range edits {
			e(devs[r])
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := base
			cfg.Rank, cfg.WorldSize, cfg.Device, cfg.Store, cfg.Library = r, world, r, store, collectives.Library
			if allocs != nil {
				cfg.Allocator = allocs[r]
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			comms[r], errs[r] = newComm(ctx, cfg, func(Config) (device, error) { return devs[r], nil })
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return comms, devs
}

func newAllocs(t *testing.T, world int, log *eventLog) []*alloc.Allocator {
	t.Helper()
	out := make([]*alloc.Allocator, world)
	for r := range out {
		a, err := alloc.New(&fakeAllocDriver{name: fmt.Sprintf("dev%d", r), log: log, next: cuda.DevicePtr(0x5000_0000_0000 + r<<36)}, alloc.Options{})
		if err != nil {
			t.Fatal(err)
		}
		out[r] = a
	}
	return out
}

func wantLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestRegistrationHooks: segments existing at New are registered, new ones
// through the hook, each deregistered before the driver frees it, and
// every registration goes at Close; after Close the hook is gone.
func TestRegistrationHooks(t *testing.T) {
	log := &eventLog{}
	allocs := newAllocs(t, 2, log)
	b0, err := allocs[0].Alloc(1000, nil) // a 2 MiB segment before New
	if err != nil {
		t.Fatal(err)
	}
	n := len(log.all())
	comms, _ := regComms(t, rendezvous.NewMemStore(), "A", 2, log, allocs)
	seg0 := uintptr(0x5000_0000_0000)
	wantLines(t, "New registers the existing segment", log.since(n), []string{fmt.Sprintf("A0 register %#x %d -> h1", seg0, 2<<20)})

	n = len(log.all())
	b1, _ := allocs[0].Alloc(3<<20, nil) // a new 4 MiB segment
	allocs[0].Free(b0)
	allocs[0].Free(b1)
	if err := allocs[0].EmptyCache(); err != nil {
		t.Fatal(err)
	}
	seg1 := seg0 + 2<<20
	wantLines(t, "hook registers, deregisters before the free", log.since(n), []string{
		fmt.Sprintf("dev0 driver alloc %#x %d", seg1, 4<<20),
		fmt.Sprintf("A0 register %#x %d -> h2", seg1, 4<<20),
		"A0 deregister h1",
		fmt.Sprintf("dev0 driver free %#x", seg0),
		"A0 deregister h2",
		fmt.Sprintf("dev0 driver free %#x", seg1),
	})

	b2, _ := allocs[0].Alloc(100, nil)
	n = len(log.all())
	closeAll(t, comms)
	got := log.since(n)
	if i, j := slices.Index(got, "A0 deregister h3"), slices.Index(got, "A0 release"); i < 0 || j < 0 || i > j {
		t.Errorf("Close: %q, want h3 deregistered before the device is released", got)
	}
	n = len(log.all())
	allocs[0].Free(b2)
	allocs[0].EmptyCache()
	for _, l := range log.since(n) {
		if strings.HasPrefix(l, "A0 ") {
			t.Errorf("the hook still ran after Close: %s", l)
		}
	}
}

// TestRegistrationRefcounts: repeats count, the last deregistration calls
// NCCL, and unknown, repeated, overlapping and refused registrations are
// errors that say so.
func TestRegistrationRefcounts(t *testing.T) {
	log := &eventLog{}
	comms, devs := regComms(t, rendezvous.NewMemStore(), "R", 2, log, nil)
	defer closeAll(t, comms)
	c := comms[0]
	p := cuda.DevicePtr(0x9000_0000)
	n := len(log.all())
	for i := 0; i < 2; i++ {
		if err := c.RegisterBuffer(p, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeregisterBuffer(p); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "two registrations, one deregistration", log.since(n), []string{"R0 register 0x90000000 4096 -> h1"})
	if err := c.DeregisterBuffer(p); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "the last deregistration", log.since(n), []string{"R0 register 0x90000000 4096 -> h1", "R0 deregister h1"})
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"again", c.DeregisterBuffer(p), "already deregistered"},
		{"unknown", c.DeregisterBuffer(0x1234), "not registered"},
		{"nil", c.RegisterBuffer(0, 10), "need a device address"},
		{"wraps", c.RegisterBuffer(cuda.DevicePtr(math.MaxUint64-10), 100), "ends inside the address space"},
	}
	if err := c.RegisterBuffer(p, 8192); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, struct {
		name string
		err  error
		want string
	}{"overlap", c.RegisterBuffer(p+4096, 8192), "overlaps a registered buffer"})
	devs[0].refuse[0x7777_0000] = "host memory"
	cases = append(cases, struct {
		name string
		err  error
		want string
	}{"refused", c.RegisterBuffer(0x7777_0000, 64), "host memory"})
	cases = append(cases, struct {
		name string
		err  error
		want string
	}{"window as buffer", c.DeregisterWindow(context.Background(), p), "registered as a buffer"})
	for _, tc := range cases {
		if !errors.Is(tc.err, ErrInvalidArgument) || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument saying %q", tc.name, tc.err, tc.want)
		}
	}
	if got := len(comms[0].reg.registered()); got != 1 {
		t.Errorf("%d registrations left, want 1", got)
	}
}

// TestRegistrationTwoComms: two communicators on one device (two groups
// sharing one allocator) each register every segment and deregister it
// before the free; closing one leaves the other's registrations.
func TestRegistrationTwoComms(t *testing.T) {
	log := &eventLog{}
	allocs := newAllocs(t, 2, log)
	store := rendezvous.NewMemStore()
	a, _ := regComms(t, store, "A", 2, log, allocs)
	bc, _ := regComms(t, store, "B", 2, log, allocs)
	defer closeAll(t, bc)
	n := len(log.all())
	blk, _ := allocs[1].Alloc(10, nil)
	seg := uintptr(0x5000_0000_0000 + 1<<36)
	got := log.since(n)
	want := []string{fmt.Sprintf("dev1 driver alloc %#x %d", seg, 2<<20), fmt.Sprintf("A1 register %#x %d -> h1", seg, 2<<20), fmt.Sprintf("B1 register %#x %d -> h1", seg, 2<<20)}
	wantLines(t, "both communicators register the segment", got, want)
	closeAll(t, a)
	n = len(log.all())
	allocs[1].Free(blk)
	allocs[1].EmptyCache()
	wantLines(t, "only B deregisters after A closed", log.since(n), []string{"B1 deregister h1", fmt.Sprintf("dev1 driver free %#x", seg)})
}

// TestAbortKeepsRegionForPeers (reliability case 9): Abort frees the
// rank's device resources but its staging region, which live peers' kernels
// signal into and read, until every rank has left the group; with a peer
// that never leaves, until parkFactor x Config.Timeout. Freed at Abort (as
// before), a live peer's kernel faulted.
func TestAbortKeepsRegionForPeers(t *testing.T) {
	freed := func(d *regDevice) chan struct{} {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.regionFreed
	}
	// A peer leaves: the region goes then, long before the bound (20 s).
	comms, devs := regCommsWith(t, rendezvous.NewMemStore(), Config{Group: "K", Timeout: 5 * time.Second}, 2, &eventLog{}, nil)
	if err := comms[0].Abort(); err != nil {
		t.Fatal(err)
	}
	if !devs[0].released {
		t.Error("Abort did not release the rank's other resources")
	}
	select {
	case <-freed(devs[0]):
		t.Fatal("the region was freed while the peer is still in the group")
	case <-time.After(300 * time.Millisecond):
	}
	if err := comms[1].Abort(); err != nil {
		t.Fatal(err)
	}
	for r, d := range devs {
		select {
		case <-freed(d):
		case <-time.After(5 * time.Second):
			t.Errorf("rank %d: region not freed 5 s after every rank left", r)
		}
	}
	// A peer that never leaves: the region goes after the bound (1 s).
	comms, devs = regCommsWith(t, rendezvous.NewMemStore(), Config{Group: "L", Timeout: 250 * time.Millisecond}, 2, &eventLog{}, nil)
	defer comms[1].Abort()
	start := time.Now()
	if err := comms[0].Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-freed(devs[0]):
		if el := time.Since(start); el < parkFactor*250*time.Millisecond {
			t.Errorf("freed after %v, before the bound %v with the peer in the group", el, parkFactor*250*time.Millisecond)
		}
	case <-time.After(10 * time.Second):
		t.Error("region not freed 10 s after Abort, past the bound")
	}
	// The caller closes the store after Abort (and may remove a file
	// store's directory): the region waits out the bound without asking
	// the closed store again.
	st := &closeWatch{Store: rendezvous.NewMemStore()}
	comms, devs = regCommsWith(t, st, Config{Group: "M", Timeout: 250 * time.Millisecond}, 2, &eventLog{}, nil)
	defer comms[1].Abort()
	if err := comms[0].Abort(); err != nil {
		t.Fatal(err)
	}
	st.Close()
	select {
	case <-freed(devs[0]):
	case <-time.After(10 * time.Second):
		t.Error("region not freed 10 s after Abort with the store closed")
	}
	if n := st.late.Load(); n > 1 {
		t.Errorf("the aborted rank asked the closed store %d times", n)
	}
}

// closeWatch counts the Add calls made after its Close.
type closeWatch struct {
	rendezvous.Store
	closed atomic.Bool
	late   atomic.Int64
}

func (s *closeWatch) Close() error { s.closed.Store(true); return s.Store.Close() }

func (s *closeWatch) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if s.closed.Load() {
		s.late.Add(1)
	}
	return s.Store.Add(ctx, key, delta)
}

// TestAbortFake: Abort from another goroutine while a collective waits:
// the call returns ErrAborted promptly, kernels are released through the
// abort word and the signal pad, registrations are forgotten, not
// deregistered (ncclCommAbort frees them all; a deregistration could wait
// behind the NCCL call in flight), later calls fail fast, and a new group
// on a fresh store works.
func TestAbortFake(t *testing.T) {
	log := &eventLog{}
	allocs := newAllocs(t, 2, log)
	blk, _ := allocs[0].Alloc(100, nil)
	defer allocs[0].Free(blk)
	comms, devs := regComms(t, rendezvous.NewMemStore(), "X", 2, log, allocs)
	defer comms[1].Abort() // a closing peer would wait for rank 0 at the close barrier
	c, d := comms[0], devs[0]
	if err := errors.Join(onRanks(comms, func(_ int, c *Communicator) error {
		return c.RegisterWindow(context.Background(), 0xa000_0000, 1<<20) // collective
	})...); err != nil {
		t.Fatal(err)
	}
	d.stuck = make(chan struct{})
	res := make(chan error, 1)
	go func() {
		res <- c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 64, coll.F32, coll.Sum, Options{})
	}()
	<-d.waiting
	n := len(log.all())
	start := time.Now()
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	err := <-res
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "aborted") {
		t.Errorf("blocked call: %v, want ErrAborted", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Abort took %v", el)
	}
	wantLines(t, "abort order", log.since(n), []string{"X0 release kernels", "X0 nccl abort", "X0 release"})
	if regs := c.reg.registered(); len(regs) != 0 || !d.released {
		t.Errorf("after Abort: %d registrations left, device released %v", len(regs), d.released)
	}
	g := c.gpu
	if want := g.seq + cuda.DevicePtr((collectives.Library.MaxBlocks+2)*8); d.abortAt != want {
		t.Errorf("released kernels through %#x, want the abort word %#x", d.abortAt, want)
	}
	start = time.Now()
	for name, err := range map[string]error{
		"AllGather":      c.AllGather(DeviceBuffer(0x1000), DeviceBuffer(0x2000), 64, coll.F32, Options{}),
		"Synchronize":    c.Synchronize(nil),
		"RegisterBuffer": c.RegisterBuffer(0x1000, 64),
		"Abort again":    c.Abort(),
		"Close":          c.Close(),
	} {
		want := ErrAborted
		if strings.HasPrefix(name, "Abort") || name == "Close" {
			want = nil
		}
		if !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Errorf("%s after Abort: %v, want %v", name, err, want)
		}
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("calls after Abort took %v", el)
	}
	// A fresh group works.
	fresh, _ := regComms(t, rendezvous.NewMemStore(), "X", 2, log, nil)
	if err := errors.Join(onRanks(fresh, func(_ int, c *Communicator) error {
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 64, coll.F32, coll.Sum, Options{})
	})...); err != nil {
		t.Errorf("a new communicator after Abort: %v", err)
	}
	closeAll(t, fresh)
}

// TestWindowsDeregisteredInOrder: Close deregisters windows (collective)
// in registration order, the same on every rank whatever the addresses.
func TestWindowsDeregisteredInOrder(t *testing.T) {
	log := &eventLog{}
	comms, _ := regComms(t, rendezvous.NewMemStore(), "W", 2, log, nil)
	ctx := context.Background()
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		// Rank 1's second window lies below its first.
		first, second := cuda.DevicePtr(0xa000_0000), cuda.DevicePtr(0xb000_0000)
		if r == 1 {
			second = 0x9000_0000
		}
		return errors.Join(c.RegisterWindow(ctx, first, 4096), c.RegisterWindow(ctx, second, 4096))
	})...); err != nil {
		t.Fatal(err)
	}
	if err := comms[0].RegisterBuffer(0xa000_0000, 4096); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "overlaps a registered window") {
		t.Errorf("a buffer over a window: %v", err)
	}
	n := len(log.all())
	closeAll(t, comms)
	for _, name := range []string{"W0", "W1"} {
		var order []string
		for _, l := range log.since(n) {
			if strings.HasPrefix(l, name+" window deregister") {
				order = append(order, l)
			}
		}
		wantLines(t, name+" window deregistrations", order, []string{name + " window deregister h1", name + " window deregister h2"})
	}
}

// TestAllocRegistersWindow: with Config.NCCLWindows a buffer from Alloc
// (symmetric, VMM) is registered as an NCCL window on every rank, and
// deregistered at Close; without, it is not.
func TestAllocRegistersWindow(t *testing.T) {
	log := &eventLog{}
	plain, _ := regComms(t, rendezvous.NewMemStore(), "P", 2, log, nil)
	if err := errors.Join(onRanks(plain, func(r int, c *Communicator) error {
		_, err := c.Alloc(context.Background(), 1<<20)
		return err
	})...); err != nil {
		t.Fatal(err)
	}
	if regs := plain[0].reg.registered(); len(regs) != 0 {
		t.Errorf("without NCCLWindows: %+v registered", regs)
	}
	closeAll(t, plain)
	comms, _ := regCommsWith(t, rendezvous.NewMemStore(), Config{Group: "S", NCCLWindows: true}, 2, log, nil)
	ptrs := make([]cuda.DevicePtr, 2)
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) (err error) {
		ptrs[r], err = c.Alloc(context.Background(), 1<<20)
		return err
	})...); err != nil {
		t.Fatal(err)
	}
	for r, c := range comms {
		regs := c.reg.registered()
		if len(regs) != 1 || !regs[0].window || regs[0].base != ptrs[r] || regs[0].bytes != 1<<20 {
			t.Errorf("rank %d: registrations %+v, want one window at %#x", r, regs, uintptr(ptrs[r]))
		}
	}
	n := len(log.all())
	closeAll(t, comms)
	got := strings.Join(log.since(n), "\n")
	for _, want := range []string{"S0 window deregister h1", "S1 window deregister h1"} {
		if !strings.Contains(got, want) {
			t.Errorf("Close: %q missing from\n%s", want, got)
		}
	}
}

// TestOldNCCLNoRegistration: with an NCCL that cannot register buffers
// (before 2.19) or has no windows (before 2.27), New succeeds on every rank
// whatever its allocator holds (it failed on the ranks whose allocator had
// a segment), the allocator is left alone, and RegisterBuffer and
// RegisterWindow return ErrUnsupported naming the version.
func TestOldNCCLNoRegistration(t *testing.T) {
	log := &eventLog{}
	allocs := newAllocs(t, 2, log)
	blk, _ := allocs[0].Alloc(100, nil) // rank 0 holds a segment, rank 1 none
	defer allocs[0].Free(blk)
	comms, _ := regCommsWith(t, rendezvous.NewMemStore(), Config{Group: "O"}, 2, log, allocs, func(d *regDevice) {
		d.noReg = "NCCL 2.18.5 cannot register buffers (ncclCommRegister, 2.19+)"
		d.noWin = "NCCL 2.18.5 has no windows (2.27+)"
	})
	defer closeAll(t, comms)
	for _, l := range log.all() {
		if strings.Contains(l, "register") {
			t.Errorf("registration with an NCCL that has none: %q", l)
		}
	}
	if err := comms[0].RegisterBuffer(0x9000_0000, 4096); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "2.19") {
		t.Errorf("RegisterBuffer: %v; want ErrUnsupported naming 2.19", err)
	}
	if err := comms[0].RegisterWindow(context.Background(), 0xa000_0000, 1<<20); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "2.27") {
		t.Errorf("RegisterWindow: %v; want ErrUnsupported naming 2.27", err)
	}
}

// TestParkBoundSaturates: Abort's bound on keeping the region for peers
// saturates instead of overflowing (Timeout math.MaxInt64 made it
// negative, freeing the region under a live peer's kernel at once).
func TestParkBoundSaturates(t *testing.T) {
	for _, c := range []struct{ timeout, want time.Duration }{
		{time.Second, 4 * time.Second},
		{math.MaxInt64 / 4, 4 * (math.MaxInt64 / 4)},
		{math.MaxInt64/4 + 1, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
	} {
		if got := parkBound(c.timeout); got != c.want {
			t.Errorf("parkBound(%v) = %v, want %v", c.timeout, got, c.want)
		}
	}
}

// An aborted group leaves no keys in the store either: the aborted rank
// that waits for the others to leave before freeing its region read the
// members counter with Add, which made it again (at 0) once the last
// member's forget had deleted it.
func TestAbortedGroupLeavesNoStoreKeys(t *testing.T) {
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	comms, devs := regCommsWith(t, st, Config{Group: "KA", Timeout: 5 * time.Second}, 2, &eventLog{}, nil)
	for r, c := range comms {
		if err := c.Abort(); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for _, d := range devs {
		d.mu.Lock()
		freed := d.regionFreed
		d.mu.Unlock()
		<-freed
	}
	if left := st.Live(); len(left) > 0 {
		t.Fatalf("%d keys left after every rank aborted: %q", len(left), left)
	}
}

// collWindows makes a group's fake devices register windows collectively
// (fakeWindowNCCL).
func collWindows(world int) func(*regDevice) {
	f := newFakeWindowNCCL(world)
	return func(d *regDevice) { d.coll = f }
}

// within runs fn and returns its error, failing t if fn has not returned
// after limit (fn is then left running: it hangs).
func within(t *testing.T, limit time.Duration, what string, fn func() error) error {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- fn() }()
	select {
	case err := <-res:
		return err
	case <-time.After(limit):
		t.Fatalf("%s still waits after %v", what, limit)
		return nil
	}
}

// TestRegisterWindowBounded: ncclCommWindowRegister is collective, and on
// a blocking NCCL communicator (the default) it waits for every rank
// without bound (the fake NCCL does too). A RegisterWindow whose peer
// never calls it, or has aborted, now returns ErrTimeout naming the peer
// after Config.Timeout, without entering NCCL, and leaves the NCCL
// communicator aborted, as a timed-out NCCL collective does: later window
// calls fail at once, and a peer arriving late, which gets past the
// meeting and enters NCCL, is released by that abort. Abort ends a wait
// at once. (Before, RegisterWindow entered NCCL at once and waited there
// for ever, and Abort waited for it.)
func TestRegisterWindowBounded(t *testing.T) {
	const timeout = 300 * time.Millisecond
	ctx := context.Background()
	t.Run("absent peer", func(t *testing.T) {
		log := &eventLog{}
		st := storetest.NewKeyStore(rendezvous.NewMemStore())
		comms, _ := regCommsWith(t, st, Config{Group: "T", Timeout: timeout}, 2, log, nil, collWindows(2))
		start := time.Now()
		err := within(t, 10*time.Second, "RegisterWindow with its peer absent", func() error {
			return comms[0].RegisterWindow(ctx, 0xa000_0000, 1<<20)
		})
		el := time.Since(start)
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "RegisterWindow") || !strings.Contains(err.Error(), "rank 1 did not join") {
			t.Fatalf("RegisterWindow without its peer: %v; want ErrTimeout naming RegisterWindow and rank 1", err)
		}
		if el < timeout || el > timeout+2*time.Second {
			t.Errorf("it returned after %v; want about Config.Timeout (%v)", el, timeout)
		}
		got := strings.Join(log.all(), "\n")
		if !strings.Contains(got, "T0 nccl abort") || strings.Contains(got, "T0 window") {
			t.Errorf("log:\n%s\nwant rank 0's NCCL aborted and never entered", got)
		}
		if regs := comms[0].reg.registered(); len(regs) != 0 {
			t.Errorf("registrations after the timeout: %+v", regs)
		}
		start = time.Now()
		if err := comms[0].RegisterWindow(ctx, 0xb000_0000, 1<<20); !errors.Is(err, ErrAborted) || time.Since(start) > timeout/2 {
			t.Errorf("the next RegisterWindow: %v after %v; want ErrAborted at once", err, time.Since(start))
		}
		// The late peer meets rank 0's note, enters NCCL and is released by
		// rank 0's abort.
		err = within(t, 10*time.Second, "the late peer's RegisterWindow", func() error {
			return comms[1].RegisterWindow(ctx, 0xa000_0000, 1<<20)
		})
		if err == nil {
			t.Error("the late peer registered a window its peer never registered")
		}
		for _, c := range comms {
			c.Close()
		}
		if left := st.Live(); len(left) > 0 {
			t.Errorf("%d keys left after Close: %q", len(left), left)
		}
	})
	t.Run("aborted peer", func(t *testing.T) {
		comms, _ := regCommsWith(t, rendezvous.NewMemStore(), Config{Group: "D", Timeout: timeout}, 2, &eventLog{}, nil, collWindows(2))
		defer comms[0].Abort()
		comms[1].Abort()
		err := within(t, 10*time.Second, "RegisterWindow with its peer aborted", func() error {
			return comms[0].RegisterWindow(ctx, 0xa000_0000, 1<<20)
		})
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "rank 1 did not join") {
			t.Errorf("RegisterWindow with its peer aborted: %v; want ErrTimeout naming rank 1", err)
		}
	})
	t.Run("abort ends the wait", func(t *testing.T) {
		comms, _ := regCommsWith(t, rendezvous.NewMemStore(), Config{Group: "E", Timeout: time.Minute}, 2, &eventLog{}, nil, collWindows(2))
		defer comms[1].Abort()
		res := make(chan error, 1)
		go func() { res <- comms[0].RegisterWindow(ctx, 0xa000_0000, 1<<20) }()
		time.Sleep(100 * time.Millisecond) // into the wait
		start := time.Now()
		if err := within(t, 10*time.Second, "Abort during RegisterWindow", comms[0].Abort); err != nil {
			t.Error(err)
		}
		select {
		case err := <-res:
			if !errors.Is(err, ErrAborted) {
				t.Errorf("RegisterWindow ended by Abort: %v; want ErrAborted", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("RegisterWindow still waits 10 s after Abort")
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("Abort and the wait's end took %v", el)
		}
	})
}

// TestRegisterWindowAgreement: ranks registering windows of different
// sizes, or one registering a range again (counted, no NCCL call) where
// another registers a new one, or one refusing its window, all return
// errors at once without calling NCCL (before, the ranks that called it
// waited there for ever); the communicator stays usable.
func TestRegisterWindowAgreement(t *testing.T) {
	ctx := context.Background()
	log := &eventLog{}
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	comms, devs := regCommsWith(t, st, Config{Group: "G", Timeout: 5 * time.Second}, 2, log, nil, collWindows(2))
	devs[1].refuse[0xc000_0000] = "host memory"
	n := len(log.all())
	for _, tc := range []struct {
		name       string
		p0, p1     cuda.DevicePtr
		b0, b1     int64
		want0      error
		want1      error
		say0, say1 string
	}{
		{"sizes", 0xa000_0000, 0xa000_0000, 4096, 8192, ErrMismatch, ErrMismatch, `rank 1's is "new 8192"`, `rank 0's is "new 4096"`},
		{"refusal", 0xa000_0000, 0xc000_0000, 4096, 4096, ErrMismatch, ErrInvalidArgument, "refused: ", "host memory"},
		{"nil address", 0xa000_0000, 0, 4096, 4096, ErrMismatch, ErrInvalidArgument, "need a device address", "need a device address"},
	} {
		start := time.Now()
		errs := onRanks(comms, func(r int, c *Communicator) error {
			if r == 0 {
				return c.RegisterWindow(ctx, tc.p0, tc.b0)
			}
			return c.RegisterWindow(ctx, tc.p1, tc.b1)
		})
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("%s: took %v; want the disagreement seen at once", tc.name, el)
		}
		for r, want := range []error{tc.want0, tc.want1} {
			say := []string{tc.say0, tc.say1}[r]
			if !errors.Is(errs[r], want) || !strings.Contains(errs[r].Error(), say) {
				t.Errorf("%s: rank %d: %v; want %v saying %q", tc.name, r, errs[r], want, say)
			}
		}
	}
	if got := log.since(n); len(got) != 0 {
		t.Errorf("NCCL called on a disagreement: %q", got)
	}
	// A repeat on one rank, a new window on the other.
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error { return c.RegisterWindow(ctx, 0xa000_0000, 4096) })...); err != nil {
		t.Fatal(err)
	}
	errs := onRanks(comms, func(r int, c *Communicator) error {
		return c.RegisterWindow(ctx, 0xa000_0000+cuda.DevicePtr(r)<<20, 4096)
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "repeat 4096") {
			t.Errorf("repeat against new: rank %d: %v; want ErrMismatch naming the repeat", r, err)
		}
	}
	// Still usable: a repeat on both counts, a new window on both registers.
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		return errors.Join(c.RegisterWindow(ctx, 0xa000_0000, 4096), c.RegisterWindow(ctx, 0xb000_0000, 4096))
	})...); err != nil {
		t.Fatal(err)
	}
	for r, c := range comms {
		regs := c.reg.registered()
		if len(regs) != 2 || regs[0].refs != 2 || regs[1].refs != 1 {
			t.Errorf("rank %d: registrations %+v; want 0xa0000000 twice, 0xb0000000 once", r, regs)
		}
	}
	closeAll(t, comms)
	if left := st.Live(); len(left) > 0 {
		t.Errorf("%d keys left after Close: %q", len(left), left)
	}
}

// TestWindowMeetingLeavesRegistryFree: while a RegisterWindow waits in
// its store meeting for a peer (up to Config.Timeout), the rank's other
// registrations go on: the allocator's hook registers a new segment and
// deregisters it at its free, and RegisterBuffer and DeregisterBuffer of
// another range, and DeregisterWindow of another window, return at once;
// a buffer over the window being registered is refused. When the peer comes, the window is registered on both.
// (Before, the meeting held the registry's lock, so the allocator, whose
// hook runs under its own lock, and every registration waited for it.)
func TestWindowMeetingLeavesRegistryFree(t *testing.T) {
	ctx := context.Background()
	log := &eventLog{}
	allocs := newAllocs(t, 2, log)
	st := rendezvous.NewMemStore()
	comms, _ := regCommsWith(t, st, Config{Group: "Q", Timeout: 10 * time.Second}, 2, log, allocs, collWindows(2))
	t.Cleanup(func() {
		for _, c := range comms {
			c.Abort() // ends a meeting left waiting by a failure
		}
	})
	const win, old = cuda.DevicePtr(0xa000_0000), cuda.DevicePtr(0xb000_0000)
	if err := errors.Join(onRanks(comms, func(_ int, c *Communicator) error { return c.RegisterWindow(ctx, old, 4096) })...); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { res <- comms[0].RegisterWindow(ctx, win, 1<<20) }()
	// Rank 0's note is in: it waits for rank 1.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := st.Get(wctx, "collgen/allgather/"+comms[0].prefix+"window/2/0"); err != nil {
		t.Fatalf("rank 0's meeting note: %v", err)
	}
	const limit = 5 * time.Second
	n := len(log.all())
	var blk *alloc.Block
	if err := within(t, limit, "the allocator (its hook) during a window meeting", func() (err error) {
		blk, err = allocs[0].Alloc(100, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	seg := uintptr(0x5000_0000_0000)
	wantLines(t, "the hook registers the new segment", log.since(n), []string{
		fmt.Sprintf("dev0 driver alloc %#x %d", seg, 2<<20),
		fmt.Sprintf("Q0 register %#x %d -> h2", seg, 2<<20),
	})
	if err := within(t, limit, "RegisterBuffer during a window meeting", func() error {
		return errors.Join(comms[0].RegisterBuffer(0x9000_0000, 4096), comms[0].DeregisterBuffer(0x9000_0000))
	}); err != nil {
		t.Fatal(err)
	}
	if err := within(t, limit, "DeregisterWindow of another window during a window meeting", func() error { return comms[0].DeregisterWindow(ctx, old) }); err != nil {
		t.Fatal(err)
	}
	err := within(t, limit, "RegisterBuffer over the window being registered", func() error { return comms[0].RegisterBuffer(win, 4096) })
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "overlaps a window being registered") {
		t.Errorf("a buffer over the window being registered: %v; want ErrInvalidArgument saying so", err)
	}
	n = len(log.all())
	if err := within(t, limit, "the allocator's free during a window meeting", func() error {
		return errors.Join(allocs[0].Free(blk), allocs[0].EmptyCache())
	}); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "the hook deregisters the segment before its free", log.since(n), []string{"Q0 deregister h2", fmt.Sprintf("dev0 driver free %#x", seg)})
	select {
	case err := <-res:
		t.Fatalf("rank 0's RegisterWindow returned without its peer: %v", err)
	default:
	}
	if err := within(t, limit, "rank 1's RegisterWindow", func() error { return comms[1].RegisterWindow(ctx, win, 1<<20) }); err != nil {
		t.Fatal(err)
	}
	if err := within(t, limit, "rank 0's RegisterWindow once rank 1 came", func() error { return <-res }); err != nil {
		t.Fatal(err)
	}
	for r, c := range comms {
		want := []cuda.DevicePtr{old, win}[1-r:] // rank 0 deregistered old
		regs := c.reg.registered()
		var got []cuda.DevicePtr
		for _, reg := range regs {
			if reg.window {
				got = append(got, reg.base)
			}
		}
		if len(regs) != 1+r || !slices.Equal(got, want) {
			t.Errorf("rank %d: registrations %+v; want windows at %#x", r, regs, want)
		}
	}
	closeAll(t, comms)
}

// TestWindowMeetingStateChecked: the registry's state is checked again
// after a window meeting, which runs without its lock. The range freed by
// the allocator meanwhile fails the call (a new window: the peers go on
// into NCCL, so this rank's NCCL communicator is aborted and later window
// calls fail at once; a repeat: no rank calls NCCL, nothing is aborted),
// and a Close meanwhile is ErrClosed without an NCCL call, even where the
// meeting itself succeeded.
func TestWindowMeetingStateChecked(t *testing.T) {
	const p, bytes = cuda.DevicePtr(0x1_0000_0000), 4096
	// slowReg returns a registry whose meeting, once entered, waits for
	// release and then succeeds (every rank's note its own) whatever its
	// ctx; *aborts counts NCCL aborts.
	slowReg := func() (g *registry, h *handleRegistrar, entered chan struct{}, release chan struct{}, aborts *int) {
		h = &handleRegistrar{live: map[uintptr]bool{}, ranges: map[uintptr][2]cuda.DevicePtr{}}
		g = newRegistry(h, 0)
		entered, release, aborts = make(chan struct{}, 1), make(chan struct{}), new(int)
		g.abortNCCL = func() error { *aborts++; return nil }
		g.join = func(_ context.Context, note []byte) ([][]byte, error) {
			entered <- struct{}{}
			<-release
			return [][]byte{note, note}, nil
		}
		return
	}
	// during runs addWindow, calls fn while it meets, then ends the
	// meeting and returns addWindow's error.
	during := func(t *testing.T, g *registry, entered, release chan struct{}, fn func()) error {
		t.Helper()
		res := make(chan error, 1)
		go func() { res <- g.addWindow(context.Background(), p, bytes) }()
		<-entered
		within(t, 5*time.Second, "a registry call during a window meeting", func() error { fn(); return nil })
		close(release)
		return within(t, 5*time.Second, "addWindow", func() error { return <-res })
	}
	freeSeg := alloc.Segment{Base: p, Bytes: 1 << 20}
	t.Run("new window freed", func(t *testing.T) {
		g, h, entered, release, aborts := slowReg()
		err := during(t, g, entered, release, func() { g.SegmentFreeing(freeSeg) })
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "freed while the ranks met") || *aborts != 1 {
			t.Errorf("addWindow: %v, %d NCCL aborts; want ErrInvalidArgument saying the memory was freed, and NCCL aborted", err, *aborts)
		}
		if len(h.live) != 0 || len(g.registered()) != 0 {
			t.Errorf("registered: %v, %+v; want nothing", h.live, g.registered())
		}
		if err := g.addWindow(context.Background(), p+1<<20, bytes); !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "memory was freed") {
			t.Errorf("the next window: %v; want ErrAborted saying why", err)
		}
	})
	t.Run("repeat freed", func(t *testing.T) {
		g, h, entered, release, aborts := slowReg()
		slow := g.join
		g.join = func(_ context.Context, note []byte) ([][]byte, error) { return [][]byte{note, note}, nil }
		if err := g.addWindow(context.Background(), p, bytes); err != nil {
			t.Fatal(err)
		}
		g.join = slow
		err := during(t, g, entered, release, func() { g.SegmentFreeing(freeSeg) })
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "deregistered (its memory freed) while the ranks met") || *aborts != 0 {
			t.Errorf("addWindow: %v, %d NCCL aborts; want ErrInvalidArgument saying the window went, NCCL not aborted", err, *aborts)
		}
		if len(h.live) != 0 || len(h.faults) != 0 {
			t.Errorf("registrar: live %v, faults %v; want the window deregistered once", h.live, h.faults)
		}
	})
	t.Run("closed", func(t *testing.T) {
		g, h, entered, release, aborts := slowReg()
		err := during(t, g, entered, release, func() {
			if err := g.closeAll(false); err != nil {
				t.Error(err)
			}
		})
		if !errors.Is(err, ErrClosed) || *aborts != 0 || len(h.live) != 0 || h.next != 0 {
			t.Errorf("addWindow: %v, %d NCCL aborts, %d registrations; want ErrClosed and no NCCL call", err, *aborts, h.next)
		}
	})
}
