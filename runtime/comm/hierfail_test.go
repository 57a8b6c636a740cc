package comm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// initWaits is a fake hierarchical device whose openNCCL behaves as
// nccl.NewComm does for both communicators: cross rank 0 (rank 0) publishes
// the id, the others wait for it, then ncclCommInitRank waits until every
// member of the communicator has joined.
type initWaits struct {
	*fakeHier
	st rendezvous.Store
}

func (d *initWaits) openNCCL(ctx context.Context, crossKey string, crossRank, crossWorld int, globalKey string, rank, world int) error {
	for _, c := range []struct {
		key         string
		rank, world int
	}{{crossKey, crossRank, crossWorld}, {globalKey, rank, world}} {
		if c.rank == 0 {
			if err := d.st.Set(ctx, c.key+"/nccl-id", make([]byte, 128)); err != nil {
				return err
			}
		} else if _, err := d.st.Get(ctx, c.key+"/nccl-id"); err != nil {
			return err
		}
		if err := rendezvous.Barrier(ctx, d.st, c.key+"/init", c.rank, c.world); err != nil {
			return err
		}
	}
	return nil
}

// A group spanning two hosts of two GPUs whose host b cannot form its
// host communicator (here its GPUs give no PCI bus id, so host b's
// detection fails at once with ErrDevice): host a's ranks must not wait
// for host b in NCCL's set-up until New's context ends. On one host the
// detection vote makes every rank fail together; across hosts each host
// votes alone.
func TestHierOneHostFailsOthersWait(t *testing.T) {
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	ids := []string{"a", "a", "b", "b"}
	world := len(ids)
	saved := openHier
	defer func() { openHier = saved }()
	var mu sync.Mutex
	openHier = func(c Config) (hierDevice, error) {
		mu.Lock()
		defer mu.Unlock()
		return &initWaits{&fakeHier{}, st}, nil
	}
	errs := make([]error, world)
	took := make([]time.Duration, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := Config{Rank: r, WorldSize: world, Store: st, HostID: ids[r], Device: r, Library: collectives.Library, Group: t.Name()}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			var c *Communicator
			c, errs[r] = newComm(ctx, cfg, func(sub Config) (device, error) {
				d := &fakeDevice{rank: sub.Rank}
				if sub.HostID == "b" {
					d.busErr = errors.New("cuDeviceGetPCIBusId: unknown error")
				}
				return worldDevice{d, sub.WorldSize}, nil
			})
			took[r] = time.Since(start)
			if c != nil {
				c.Abort()
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d (host %s): New succeeded though host b failed", r, ids[r])
		}
		want, kind := "rank 2 (host \"b\") failed to set up", ErrAborted
		if ids[r] == "b" {
			want, kind = "cannot read its GPU's PCI bus id", ErrDevice
		}
		if !errors.Is(err, kind) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("rank %d: %v; want %v naming %q", r, err, kind, want)
		}
		if took[r] > 5*time.Second {
			t.Errorf("rank %d (host %s): New took %v (%v); host b's ranks failed at once", r, ids[r], took[r].Round(time.Millisecond), fmt.Sprint(err))
		}
	}
	if left := st.Live(); len(left) > 0 {
		t.Errorf("%d keys left: %q", len(left), left)
	}
}
