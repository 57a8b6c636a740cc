package comm_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// Two goroutine ranks on the host backend: typed slices carry count and
// dtype, and errors match comm's sentinels.
func Example() {
	store := rendezvous.NewMemStore()
	var wg sync.WaitGroup
	out := make([][]float32, 2)
	for rank := 0; rank < 2; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := comm.New(context.Background(), comm.Config{Rank: rank, WorldSize: 2, Device: comm.Host,
				Store: store, Library: collectives.Library, Group: "example"})
			if err != nil {
				panic(err)
			}
			defer c.Close()
			out[rank] = []float32{1, float32(rank)}
			if err := comm.AllReduceSlice(c, out[rank], out[rank], coll.Sum, comm.Options{}); err != nil {
				panic(err)
			}
			// A device address on a host communicator is refused, not read.
			err = c.AllReduce(comm.DeviceBuffer(0x1000), comm.HostSlice(out[rank]), 2, coll.F32, coll.Sum, comm.Options{})
			if rank == 0 {
				fmt.Println(errors.Is(err, comm.ErrInvalidArgument))
			}
		}()
	}
	wg.Wait()
	fmt.Println(out[0], out[1])
	// Output:
	// true
	// [2 1] [2 1]
}
