package comm

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
	"github.com/collgen/collgen/runtime/symm"
)

// lateDevice is a fake GPU (publishing its keys in the store, as real
// ones do) that can fail in set-up: preload, once gate closes (a kernel
// that fails to load, after the peers gave up); setup, after publishing
// its IPC record; symmetric, before forming a pool (as a CUDA backend
// that cannot be made), or by forming a real pool (host memory) bounded
// by poolWait.
type lateDevice struct {
	worldDevice
	gate       chan struct{}
	setupErr   error
	noBackend  bool
	poolWait   time.Duration
	store      rendezvous.Store
	poolFormed *bool
}

func (d lateDevice) preload(ctx context.Context, ks []*kernels.Kernel, ids []int) error {
	if d.gate != nil {
		<-d.gate
		return errors.New("fake: kernel failed to load")
	}
	return d.worldDevice.preload(ctx, ks, ids)
}

func (d lateDevice) setup(ctx context.Context, key string, regionBytes, seqBytes int64) ([]cuda.DevicePtr, cuda.DevicePtr, cuda.DevicePtr, error) {
	regions, seq, status, err := d.worldDevice.setup(ctx, key, regionBytes, seqBytes)
	if err == nil && d.setupErr != nil {
		return nil, 0, 0, d.setupErr
	}
	return regions, seq, status, err
}

func (d lateDevice) symmetric(ctx context.Context, group string, bytes int) (cuda.DevicePtr, error) {
	if d.noBackend {
		return 0, errors.New("fake: no CUDA backend")
	}
	p, err := symm.NewPool(ctx, symm.Config{Group: group, Rank: d.rank, WorldSize: d.world, Store: d.store, Timeout: d.poolWait})
	if err != nil {
		return 0, err
	}
	*d.poolFormed = true
	return 0, errors.Join(errors.New("fake: formed a pool, allocating nothing"), p.Close())
}

// The last rank to leave a GPU group forgets every device key the group
// made, whoever made it. It forgot only the keys its own device had
// used, so where it had not opened NCCL (its kernels failed to load
// while the peers went on), rank 0's NCCL id and the peers' IPC records
// stayed; where no rank formed the pool behind Alloc (one rank's CUDA
// backend failed, the others' forming timed out), the forming
// exchange's counters stayed; across hosts, a last rank whose device
// did not open left the peers' NCCL ids.
func TestLastLeaverForgetsPeersDeviceKeys(t *testing.T) {
	needForgottenDeviceKeys(t)
	const world = 3
	newRanks := func(t *testing.T, st rendezvous.Store, devs []lateDevice, first []int) []error {
		t.Helper()
		errs := make([]error, world)
		run := func(r int, wg *sync.WaitGroup) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cfg := Config{Rank: r, WorldSize: world, Device: r, Store: st, Library: collectives.Library, Group: t.Name()}
			_, errs[r] = newComm(ctx, cfg, func(Config) (device, error) { return devs[r], nil })
		}
		var firsts, rest sync.WaitGroup
		for r := range world {
			if slices.Contains(first, r) {
				firsts.Add(1)
				go run(r, &firsts)
			} else {
				rest.Add(1)
				go run(r, &rest)
			}
		}
		firsts.Wait()
		for _, d := range devs {
			if d.gate != nil {
				close(d.gate)
			}
		}
		rest.Wait()
		return errs
	}
	fakes := func(st rendezvous.Store, edit func(r int, d *lateDevice)) []lateDevice {
		devs := make([]lateDevice, world)
		for r := range devs {
			devs[r] = lateDevice{worldDevice: worldDevice{&fakeDevice{rank: r, store: st}, world}, store: st, poolFormed: new(bool)}
			edit(r, &devs[r])
		}
		return devs
	}

	t.Run("nccl", func(t *testing.T) {
		st := storetest.NewKeyStore(rendezvous.NewMemStore())
		devs := fakes(st, func(r int, d *lateDevice) {
			if r == 2 {
				d.gate = make(chan struct{})
			} else {
				d.setupErr = errors.New("fake: out of memory")
			}
		})
		errs := newRanks(t, st, devs, []int{0, 1})
		for r, err := range errs {
			if want := []string{"fake: out of memory", "fake: out of memory", "fake: kernel failed to load"}[r]; err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("rank %d: %v; want %q", r, err, want)
			}
		}
		if !devs[0].ncclOpen || !devs[1].ncclOpen || devs[2].ncclOpen {
			t.Fatalf("NCCL opened on ranks 0, 1, 2: %v %v %v; want 0 and 1, not 2 (the last to leave)", devs[0].ncclOpen, devs[1].ncclOpen, devs[2].ncclOpen)
		}
		if left := st.Live(); len(left) > 0 {
			t.Fatalf("%d keys left: %q", len(left), left)
		}
	})

	t.Run("pool", func(t *testing.T) {
		st := storetest.NewKeyStore(rendezvous.NewMemStore())
		devs := fakes(st, func(r int, d *lateDevice) {
			d.noBackend, d.poolWait = r == 2, 300*time.Millisecond
		})
		comms := make([]*Communicator, world)
		errs := onRanks(comms, func(r int, _ *Communicator) error {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var err error
			comms[r], err = newComm(ctx, Config{Rank: r, WorldSize: world, Device: r, Store: st, Library: collectives.Library, Group: t.Name()},
				func(Config) (device, error) { return devs[r], nil })
			return err
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		errs = onRanks(comms, func(_ int, c *Communicator) error {
			_, err := c.Alloc(context.Background(), 4096)
			return err
		})
		for r, err := range errs {
			if want := []string{"ranks joined after", "ranks joined after", "fake: no CUDA backend"}[r]; err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("rank %d: Alloc: %v; want %q", r, err, want)
			}
		}
		closeAll(t, comms)
		want := []string{"collgen/symm/seen/r0", "collgen/symm/seen/r1"} // store-wide, by design
		if left := st.Live(); !slices.Equal(left, want) {
			t.Fatalf("keys left: %q, want only %q", left, want)
		}
	})

	t.Run("hosts", func(t *testing.T) {
		saved := openHier
		defer func() { openHier = saved }()
		st := storetest.NewKeyStore(rendezvous.NewMemStore())
		// Rank 0 publishes its cross-host NCCL id and fails in NCCL's
		// init; rank 1's device fails to open once rank 0 has left.
		h0 := &fakeHier{store: st, openErr: errors.New("fake: ncclCommInitRank failed")}
		gate := make(chan struct{})
		openHier = func(c Config) (hierDevice, error) {
			if c.Rank == 0 {
				return h0, nil
			}
			<-gate
			return nil, errors.New("fake: no device")
		}
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = newHostRank(t, st, r, 2)
				if r == 0 {
					close(gate)
				}
			}()
		}
		wg.Wait()
		if errs[0] == nil || errs[1] == nil || !strings.Contains(errs[1].Error(), "fake: no device") {
			t.Fatalf("errors %v, %v; want both to fail, rank 1's device not opening", errs[0], errs[1])
		}
		if left := st.Live(); len(left) > 0 {
			t.Fatalf("%d keys left: %q", len(left), left)
		}
	})
}

// needForgottenDeviceKeys skips a test that counts the store's keys after
// fake devices published theirs, in a build whose forgetDeviceKeys has
// nothing to delete (forgetsDeviceKeys).
func needForgottenDeviceKeys(t *testing.T) {
	t.Helper()
	if !forgetsDeviceKeys {
		t.Skip("without cgo forgetDeviceKeys deletes no device keys (no device opens), but the fake devices publish them")
	}
}
