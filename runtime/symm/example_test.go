//go:build linux && (amd64 || arm64)

package symm_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/symm"
)

// Two goroutine ranks allocate, rendezvous, write into each other's
// buffer, and read what the peer wrote after a barrier.
func Example() {
	const world = 2
	st := rendezvous.NewMemStore()
	got := make([]string, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			pool, err := symm.NewPool(ctx, symm.Config{Group: "example", Rank: r, WorldSize: world, Store: st})
			if err != nil {
				panic(err)
			}
			defer pool.Close()
			buf, err := pool.Alloc(64)
			if err != nil {
				panic(err)
			}
			h, err := pool.Rendezvous(ctx, buf)
			if err != nil {
				panic(err)
			}
			peer := 1 - r
			copy(h.PeerBytes(peer), fmt.Sprintf("hello from rank %d", r))
			if err := h.Barrier(symm.Now, 0, 0); err != nil {
				panic(err)
			}
			got[r] = string(buf.Bytes()[:17])
			// Nobody frees memory a peer may still be reading.
			if err := h.Barrier(symm.Now, 0, 0); err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
	fmt.Println(got[0])
	fmt.Println(got[1])
	// Output:
	// hello from rank 1
	// hello from rank 0
}
