package comm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// fakeHier records what the hierarchical backend asks of its device.
type fakeHier struct {
	mu       sync.Mutex
	log      []string
	released bool
	openErr  error // what openNCCL returns
	// store, when set, gets the NCCL ids openNCCL publishes as a real
	// device's nccl.NewComm does: the cross communicator's by cross rank
	// 0 (before an openErr: the id is out before NCCL's init fails), the
	// all-rank one by rank 0.
	store rendezvous.Store
	// hang, when set, makes synchronize wait until abort (a collective
	// across hosts whose peer is dead); abortCh is closed by abort.
	hang    bool
	abortCh chan struct{}
	waiting chan struct{} // closed when a hanging synchronize begins
	// busy is what drained reports as still running.
	busy bool
	// syncErr is what synchronize returns (an NCCL timeout, say).
	syncErr error
}

func (d *fakeHier) record(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log = append(d.log, fmt.Sprintf(format, args...))
}

func (d *fakeHier) openNCCL(_ context.Context, crossKey string, crossRank, crossWorld int, globalKey string, rank, world int) error {
	d.record("open cross %s %d/%d, all %s %d/%d", crossKey[strings.LastIndex(crossKey, "/")+1:], crossRank, crossWorld,
		globalKey[strings.LastIndex(globalKey, "/")+1:], rank, world)
	publish := func(key string, r int) error {
		if d.store == nil || r != 0 {
			return nil
		}
		return d.store.Set(context.Background(), key+"/nccl-id", make([]byte, 128))
	}
	if err := publish(crossKey, crossRank); err != nil || d.openErr != nil {
		return errors.Join(err, d.openErr)
	}
	return publish(globalKey, rank)
}

func (d *fakeHier) nccl(cross bool, c coll.Collective, in, out cuda.DevicePtr, count int64, _ coll.DType, _ coll.Op, _ *cuda.Stream) error {
	which := "all"
	if cross {
		which = "cross"
	}
	d.record("nccl %s %s %#x->%#x %d", which, c, in, out, count)
	return nil
}

func (d *fakeHier) copy(dst, src cuda.DevicePtr, bytes int64, _ *cuda.Stream) error {
	d.record("copy %#x->%#x %d", src, dst, bytes)
	return nil
}

const fakeTmp = cuda.DevicePtr(0x9000)

func (d *fakeHier) scratch(int64) (cuda.DevicePtr, error) { return fakeTmp, nil }
func (d *fakeHier) alloc(int) (cuda.DevicePtr, error)     { return 0xa000, nil }
func (d *fakeHier) synchronize(*cuda.Stream) error {
	if !d.hang {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.syncErr
	}
	close(d.waiting)
	<-d.abortCh
	return errorf(ErrAborted, "fake: aborted while waiting")
}

func (d *fakeHier) abort() {
	d.record("abort")
	if d.abortCh != nil {
		close(d.abortCh)
	}
}

func (d *fakeHier) drained(time.Duration) bool { return !d.busy }

func (d *fakeHier) ncclError() error         { return nil }
func (d *fakeHier) cudaDevice() *cuda.Device { return nil }
func (d *fakeHier) stream() *cuda.Stream     { return nil }
func (d *fakeHier) release() error           { d.released = true; return nil }

// hierComms makes goroutine-rank GPU communicators whose ranks sit on the
// hosts named by ids, over fake devices; intra holds each rank's fake for
// the nested host communicator.
func hierComms(t *testing.T, store rendezvous.Store, ids []string, cfg Config) (comms []*Communicator, hier []*fakeHier, errs []error) {
	t.Helper()
	world := len(ids)
	hier = make([]*fakeHier, world)
	var mu sync.Mutex
	byRank := map[int]*fakeHier{}
	for r := range hier {
		hier[r] = &fakeHier{store: store, abortCh: make(chan struct{})}
		byRank[r] = hier[r]
	}
	saved := openHier
	openHier = func(c Config) (hierDevice, error) { mu.Lock(); defer mu.Unlock(); return byRank[c.Rank], nil }
	t.Cleanup(func() { openHier = saved })
	if cfg.Library == nil {
		cfg.Library = collectives.Library
	}
	if cfg.Group == "" {
		cfg.Group = t.Name()
	}
	comms, errs = make([]*Communicator, world), make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg
			c.Rank, c.WorldSize, c.Store, c.HostID = r, world, store, ids[r]
			if c.Device != Host {
				c.Device = r
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			open := func(sub Config) (device, error) {
				return worldDevice{&fakeDevice{rank: sub.Rank, store: sub.Store}, sub.WorldSize}, nil
			}
			comms[r], errs[r] = newComm(ctx, c, open)
		}()
	}
	wg.Wait()
	return comms, hier, errs
}

// newHostRank forms rank r of a group of world ranks named for t on st,
// one rank per host (host "h<r>"), its device a fake that publishes its
// keys in st as a real one does; openHier gives the cross-host side.
func newHostRank(t *testing.T, st rendezvous.Store, r, world int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := Config{Rank: r, WorldSize: world, Device: r, Store: st, Library: collectives.Library, Group: t.Name(), HostID: fmt.Sprint("h", r)}
	_, err := newComm(ctx, cfg, func(sub Config) (device, error) {
		return worldDevice{&fakeDevice{rank: sub.Rank, store: st}, sub.WorldSize}, nil
	})
	return err
}

// TestHierOneRankPerHost: two hosts of one GPU each; the host steps are
// copies and the cross step is NCCL between the two ranks.
func TestHierOneRankPerHost(t *testing.T) {
	comms, hier, errs := hierComms(t, rendezvous.NewMemStore(), []string{"a", "b"}, Config{})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := hier[1].log[0]; got != "open cross 0 1/2, all nccl 1/2" {
		t.Fatalf("rank 1 opened %q", got)
	}
	c := comms[1]
	if alg, err := c.Choose(coll.AllReduce, 1<<20, coll.F32, coll.Sum); err != nil || alg != coll.Hierarchical {
		t.Fatalf("Choose = %v, %v; want hierarchical", alg, err)
	}
	in, out := DeviceBuffer(0x1000), DeviceBuffer(0x5000)
	errs = onRanks(comms, func(r int, c *Communicator) error {
		return errors.Join(
			c.AllReduce(in, out, 8, coll.F32, coll.Sum, Options{}),
			c.ReduceScatter(in, out, 2, coll.F32, coll.Sum, Options{}),
			c.AllGather(in, out, 2, coll.F32, Options{}))
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	want := []string{
		// all-reduce: host reduce-scatter (a copy), cross all-reduce in place, host all-gather (in place: nothing)
		"copy 0x1000->0x5000 32", "nccl cross allreduce 0x5000->0x5000 8",
		// reduce-scatter: blocks into tmp by local index, host reduce-scatter (a copy), cross reduce-scatter
		"copy 0x1000->0x9000 8", "copy 0x1008->0x9008 8", "copy 0x9000->0x9010 16", "nccl cross reduce_scatter 0x9010->0x5000 2",
		// all-gather: cross all-gather into tmp, host all-gather (a copy), blocks to ranks
		"nccl cross allgather 0x1000->0x9000 2", "copy 0x9000->0x9010 16", "copy 0x9010->0x5000 8", "copy 0x9018->0x5008 8",
	}
	if got := hier[1].log[1:]; !slices.Equal(got, want) {
		t.Fatalf("rank 1 ran\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if err := c.AllReduce(in, out, 8, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot}); !errors.Is(err, ErrUnsupported) ||
		!strings.Contains(err.Error(), "the ranks span 2 hosts and generated kernels reach one host") {
		t.Fatalf("forced oneshot across hosts = %v", err)
	}
	closeAll(t, comms)
	for r, h := range hier {
		if !h.released {
			t.Errorf("rank %d's device was not released", r)
		}
	}
}

// TestHierTwoPerHost: two hosts of two GPUs on interleaved ranks; the host
// steps are generated kernels of the nested host communicator, the cross
// step pairs ranks by local index, and odd all-reduce counts go to NCCL
// over all ranks (automatic) or are refused (forced).
func TestHierTwoPerHost(t *testing.T) {
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	comms, hier, errs := hierComms(t, st, []string{"a", "b", "a", "b"}, Config{})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// Rank 2 is host a's local index 1: cross group 1, host index 0.
	if got := hier[2].log[0]; got != "open cross 1 0/2, all nccl 2/4" {
		t.Fatalf("rank 2 opened %q", got)
	}
	for r, c := range comms {
		if c.hier.intra == nil || c.hier.intra.WorldSize() != 2 || c.hier.intra.Rank() != r/2 {
			t.Fatalf("rank %d: nested host communicator %+v", r, c.hier.intra)
		}
	}
	errs = onRanks(comms, func(r int, c *Communicator) error {
		return errors.Join(
			c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x5000), 64, coll.F32, coll.Sum, Options{}),
			c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x5000), 63, coll.F32, coll.Sum, Options{}))
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	want := []string{"nccl cross allreduce 0x5080->0x5080 32", "nccl all allreduce 0x1000->0x5000 63"}
	if got := hier[2].log[1:]; !slices.Equal(got, want) {
		t.Fatalf("rank 2 ran %q, want %q", got, want)
	}
	err := comms[0].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x5000), 63, coll.F32, coll.Sum, Options{Algorithm: coll.Hierarchical})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "63 elements do not split over the 2 ranks of each host") {
		t.Fatalf("forced hierarchical, odd count = %v", err)
	}
	closeAll(t, comms)
	// The last rank to leave forgets the NCCL ids: the all-rank one and
	// both local indices' cross-host ones; each host's nested
	// communicator, its own keys.
	needForgottenDeviceKeys(t)
	if left := st.Live(); len(left) > 0 {
		t.Fatalf("%d keys left after every rank closed: %q", len(left), left)
	}
}

// TestHierRules: MultiHostRules choose per size; bad rules are refused.
func TestHierRules(t *testing.T) {
	rules := map[coll.Collective][]kernels.Rule{coll.AllReduce: {{UpTo: 64 << 10, Use: coll.NCCL}, {Use: coll.Hierarchical}}}
	comms, _, errs := hierComms(t, rendezvous.NewMemStore(), []string{"a", "b"}, Config{MultiHostRules: rules})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		bytes int64
		want  coll.Algorithm
	}{{1 << 10, coll.NCCL}, {1 << 20, coll.Hierarchical}} {
		if got, err := comms[0].Choose(coll.AllReduce, c.bytes, coll.F32, coll.Sum); err != nil || got != c.want {
			t.Errorf("Choose(%d) = %v, %v; want %v", c.bytes, got, err, c.want)
		}
	}
	closeAll(t, comms)

	for _, c := range []struct {
		rules map[coll.Collective][]kernels.Rule
		want  string
	}{
		{map[coll.Collective][]kernels.Rule{coll.AllGather: {{Use: coll.OneShot}}}, `Config.MultiHostRules[allgather][0] uses "oneshot"; a group spanning hosts runs hierarchical or nccl`},
		{map[coll.Collective][]kernels.Rule{coll.AllReduce: {{Use: coll.NCCL, Symmetric: true}}}, "Config.MultiHostRules[allreduce][0] is for symmetric inputs only"},
		{map[coll.Collective][]kernels.Rule{coll.AllReduce: {{UpTo: -1, Use: coll.NCCL}}}, "Config.MultiHostRules[allreduce][0] has negative UpTo -1"},
	} {
		_, _, errs = hierComms(t, rendezvous.NewMemStore(), []string{"a", "b"}, Config{MultiHostRules: c.rules, Group: "bad"})
		for r, err := range errs {
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), c.want) {
				t.Errorf("rank %d: %v, want %q", r, err, c.want)
			}
		}
	}
}

// TestHierRefusals: unequal hosts, CPU ranks across hosts and NCCL
// disabled are refused on every rank with the reason, and the group name
// can be formed again afterwards (the claim was given up).
func TestHierRefusals(t *testing.T) {
	store := rendezvous.NewMemStore()
	for _, c := range []struct {
		name string
		ids  []string
		cfg  Config
		kind error
		want string
	}{
		{"unequal", []string{"a", "a", "b"}, Config{}, ErrUnsupported, `host "a" has 2 (ranks 0, 1), host "b" has 1 (rank 2)`},
		{"host backend", []string{"a", "b"}, Config{Device: Host}, ErrUnsupported, "the host backend (Config.Device = comm.Host) runs on one host only"},
		{"no nccl", []string{"a", "b"}, Config{DisableNCCL: true}, ErrUnsupported, "NCCL connects hosts, but Config.DisableNCCL is set"},
	} {
		cfg := c.cfg
		cfg.Group = "g"
		_, _, errs := hierComms(t, store, c.ids, cfg)
		for r, err := range errs {
			if !errors.Is(err, c.kind) || !strings.Contains(fmt.Sprint(err), c.want) {
				t.Errorf("%s: rank %d: %v, want %v naming %q", c.name, r, err, c.kind, c.want)
			}
		}
	}
	comms, _, errs := hierComms(t, store, []string{"h", "h"}, Config{Device: Host, Group: "g"})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("re-forming the group on one host: %v", err)
	}
	if comms[0].hier != nil || comms[0].layout.multi() {
		t.Fatal("one host must use the single-host backend")
	}
	closeAll(t, comms)
}

// TestHierRulesFromLibrary: without Config.MultiHostRules the library's
// rules (the spec's multi_host.select) decide; Config.MultiHostRules, when
// set, replaces them; a collective with neither is all hierarchical.
func TestHierRulesFromLibrary(t *testing.T) {
	lib := &kernels.Library{MultiHost: []kernels.Selection{{Topology: "multi_host", Collective: coll.AllReduce,
		Rules: []kernels.Rule{{UpTo: 1 << 20, Use: coll.NCCL}, {Use: coll.Hierarchical}}}}}
	sels, err := hierRules(Config{Library: lib, WorldSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := sels[coll.AllReduce].Choose(1<<20, false), sels[coll.AllReduce].Choose(1<<20+1, false); a != coll.NCCL || b != coll.Hierarchical {
		t.Errorf("library rules: %s at 1 MiB, %s above; want nccl, hierarchical", a, b)
	}
	if a := sels[coll.AllGather].Choose(1, false); a != coll.Hierarchical {
		t.Errorf("all-gather without rules: %s, want hierarchical", a)
	}
	sels, err = hierRules(Config{Library: lib, WorldSize: 4, MultiHostRules: map[coll.Collective][]kernels.Rule{coll.AllReduce: {{Use: coll.Hierarchical}}}})
	if err != nil || sels[coll.AllReduce].Choose(1, false) != coll.Hierarchical {
		t.Errorf("Config.MultiHostRules did not replace the library's: %v", err)
	}
}

// A hierarchical New that fails opening NCCL across hosts (some ranks
// may have published their ids by then) still has the last rank to leave
// forget the NCCL ids: the failed set-up gave no backend, so they stayed
// in the store.
func TestHierFailedOpenForgetsNCCLIDs(t *testing.T) {
	saved := openHier
	defer func() { openHier = saved }()
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	hier := []*fakeHier{{openErr: errors.New("fake: ncclCommInitRank failed"), store: st}, {openErr: errors.New("fake: ncclCommInitRank failed"), store: st}}
	openHier = func(c Config) (hierDevice, error) { return hier[c.Rank], nil }
	var wg sync.WaitGroup
	errs := make([]error, len(hier))
	for r := range hier {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = newHostRank(t, st, r, len(hier))
		}()
	}
	wg.Wait()
	for r, h := range hier {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "ncclCommInitRank failed") {
			t.Fatalf("rank %d: %v; want the NCCL failure", r, errs[r])
		}
		if !h.released {
			t.Errorf("rank %d: device not released", r)
		}
	}
	needForgottenDeviceKeys(t)
	if left := st.Live(); len(left) > 0 {
		t.Fatalf("%d keys left: %q", len(left), left)
	}
}

// Abort ends a collective across hosts that waits for a dead peer: the
// device's wait returns, its NCCL communicators are aborted, the host's
// communicator is aborted, and the device is released once its streams
// drained (left allocated, and said so, when they do not). Before, a
// collective across hosts waited in cuStreamSynchronize with no bound and
// Abort waited behind it.
func TestHierAbortWhileWaiting(t *testing.T) {
	for _, busy := range []bool{false, true} {
		t.Run(fmt.Sprint("busy ", busy), func(t *testing.T) {
			comms, hier, errs := hierComms(t, rendezvous.NewMemStore(), []string{"a", "b", "a", "b"}, Config{})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			hier[0].hang, hier[0].busy, hier[0].waiting = true, busy, make(chan struct{})
			done := make(chan error)
			go func() {
				done <- comms[0].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x5000), 1<<10, coll.F32, coll.Sum, Options{})
			}()
			<-hier[0].waiting
			start := time.Now()
			aerr := comms[0].Abort()
			if err := <-done; !errors.Is(err, ErrAborted) {
				t.Errorf("the waiting all-reduce returned %v, want ErrAborted", err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Abort took %v", took)
			}
			if busy != errors.Is(aerr, ErrTimeout) || busy == hier[0].released {
				t.Errorf("streams still busy %v: Abort returned %v, device released %v", busy, aerr, hier[0].released)
			}
			if !slices.Contains(hier[0].log, "abort") {
				t.Errorf("the device was not aborted: %v", hier[0].log)
			}
			if err := comms[0].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x5000), 8, coll.F32, coll.Sum, Options{}); !errors.Is(err, ErrAborted) {
				t.Errorf("a call after Abort: %v", err)
			}
			for _, c := range comms[1:] {
				if err := c.Abort(); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// A collective across hosts past Config.Timeout asks every rank what it
// issued: here the two hosts' ranks passed different counts.
func TestHierTimeoutNamesTheCallThatDiffers(t *testing.T) {
	diagnoseFor(t, 5*time.Second)
	comms, hier, errs := hierComms(t, rendezvous.NewMemStore(), []string{"a", "b"}, Config{})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, h := range hier {
		h.syncErr = errorf(ErrTimeout, "fake: NCCL across hosts did not finish")
	}
	errs = onRanks(comms, func(r int, c *Communicator) error {
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x5000), 8*(r+1), coll.F32, coll.Sum, Options{})
	})
	for r, err := range errs {
		want := fmt.Sprintf("rank %d issued a different call 1: allreduce of %d f32 sum, algorithm auto (runs hierarchical), where this rank issued allreduce of %d f32 sum", 1-r, 8*(2-r), 8*(r+1))
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), want) {
			t.Errorf("rank %d: %v\nwant it to contain %q", r, err, want)
		}
	}
	for _, h := range hier {
		h.mu.Lock()
		h.syncErr = nil
		h.mu.Unlock()
	}
	closeAll(t, comms)
}
