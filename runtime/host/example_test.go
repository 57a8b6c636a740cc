package host_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/host"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// Two goroutine ranks sum a float32 vector over ordinary memory (Shared
// false); the buffers are bytes, and count and dtype say what they hold.
func Example() {
	const world = 2
	store := rendezvous.NewMemStore()
	sums := make([][]float32, world)
	var wg sync.WaitGroup
	for rank := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			g, err := host.New(ctx, host.Config{Rank: rank, WorldSize: world, Store: store, Group: "example"})
			if err != nil {
				panic(err)
			}
			defer g.Close()
			buf := make([]byte, 3*4)
			for i := range 3 {
				binary.NativeEndian.PutUint32(buf[4*i:], math.Float32bits(float32(10*rank+i)))
			}
			if err := g.AllReduce(ctx, buf, buf, 3, coll.F32, coll.Sum, host.Options{}); err != nil {
				panic(err)
			}
			for i := range 3 {
				sums[rank] = append(sums[rank], math.Float32frombits(binary.NativeEndian.Uint32(buf[4*i:])))
			}
		}()
	}
	wg.Wait()
	fmt.Println(sums[0], sums[1])

	// A Config New cannot use is refused before anything is set up.
	_, err := host.New(context.Background(), host.Config{Rank: 0, WorldSize: 2, Store: store})
	fmt.Println(errors.Is(err, host.ErrInvalidArgument))
	// Output:
	// [10 12 14] [10 12 14]
	// true
}
