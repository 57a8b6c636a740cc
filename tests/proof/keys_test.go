package proof

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// TestClosedGroupKeysGPU: a GPU group formed, used (an all-reduce on
// plain memory, one on Alloc's symmetric memory) and closed leaves in the
// store only the symmetric pools' store-wide notes (one per rank number;
// world 1 makes no pool);
// the set-up's keys and the device's own (NCCL's id, the region's IPC
// records, the symmetric pool's exchanges) go with the last rank to
// leave. Twice on one store, at the proof's world and at world 1 (NCCL
// on where the GPU is not shared).
func TestClosedGroupKeysGPU(t *testing.T) {
	w := proofGPUs(t)
	for _, world := range []int{w, 1} {
		t.Run("world "+strconv.Itoa(world), func(t *testing.T) {
			st := storetest.NewKeyStore(rendezvous.NewMemStore())
			var want []string // the pools' notes (world 1 makes no pool)
			for r := range world {
				if world > 1 {
					want = append(want, "collgen/symm/seen/r"+strconv.Itoa(r))
				}
			}
			for round := range 2 {
				comms := commsWith(t, world, st, func(int) comm.Config { return comm.Config{Group: "keys"} })
				err := ranks(comms, func(r int, c *comm.Communicator) error {
					const count = 1 << 16
					plain, err := c.Device().Alloc(4 * count)
					if err != nil {
						return err
					}
					defer c.Device().Free(plain)
					if err := c.AllReduce(comm.DeviceBuffer(plain), comm.DeviceBuffer(plain), count, coll.F32, coll.Sum, comm.Options{}); err != nil {
						return err
					}
					if world == 1 {
						return c.Synchronize(nil) // one rank copies: no symmetric memory
					}
					sym, err := c.Alloc(context.Background(), 4*count)
					if err != nil {
						return err
					}
					if err := c.AllReduce(comm.DeviceBuffer(sym), comm.DeviceBuffer(sym), count, coll.F32, coll.Sum, comm.Options{}); err != nil {
						return err
					}
					return c.Synchronize(nil)
				})
				if err := errors.Join(err, closeComms(comms)); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				if left := st.Live(); !slices.Equal(left, want) {
					t.Fatalf("round %d: keys left after every rank closed: %q, want only %q", round, left, want)
				}
			}
		})
	}
}
