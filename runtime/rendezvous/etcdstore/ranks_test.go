package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// onRanks runs fn for world ranks, each with its own etcd handle (as
// processes on different hosts would have), scoped by one run id.
func onRanks(t *testing.T, ep string, world int, fn func(ctx context.Context, s rendezvous.Store, rank int) error) {
	t.Helper()
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := rendezvous.OpenRun(ctx, "etcd://"+ep, "ranks1234")
			if err != nil {
				errs[r] = err
				return
			}
			defer s.Close()
			errs[r] = fn(ctx, s, r)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestRanksOverEtcd: the rendezvous collectives and a host communicator
// (formation, agreement, all-reduce, close) run over etcd.
func TestRanksOverEtcd(t *testing.T) {
	ep := startEtcd(t)
	const world = 3
	onRanks(t, ep, world, func(ctx context.Context, s rendezvous.Store, r int) error {
		if err := rendezvous.Join(ctx, s, "g", r, world); err != nil {
			return err
		}
		for range 2 {
			all, err := rendezvous.AllGather(ctx, s, "ag", r, world, []byte{byte(r)})
			if err != nil {
				return err
			}
			for q, b := range all {
				if len(b) != 1 || int(b[0]) != q {
					return fmt.Errorf("rank %d: all-gather slot %d = %v", r, q, b)
				}
			}
			if err := rendezvous.Barrier(ctx, s, "b", r, world); err != nil {
				return err
			}
		}
		c, err := comm.New(ctx, comm.Config{Rank: r, WorldSize: world, Device: comm.Host, Store: s, Library: collectives.Library, Group: "etcd"})
		if err != nil {
			return err
		}
		buf := []float32{float32(r), 1}
		err = c.AllReduce(comm.HostSlice(buf), comm.HostSlice(buf), 2, coll.F32, coll.Sum, comm.Options{Context: ctx})
		if err == nil && (buf[0] != 3 || buf[1] != world) {
			err = fmt.Errorf("rank %d: all-reduce gave %v, want [3 %d]", r, buf, world)
		}
		return errors.Join(err, c.Close())
	})
}
