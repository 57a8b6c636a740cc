package rendezvous_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// Three goroutine ranks exchange their addresses through an in-memory
// store; processes would share a store from Open (tcp://, file://, etcd://)
// or FromEnv instead.
func ExampleAllGather() {
	const world = 3
	store := rendezvous.NewMemStore()
	defer store.Close()
	got := make([][][]byte, world)
	var wg sync.WaitGroup
	for rank := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			blobs, err := rendezvous.AllGather(context.Background(), store, "addrs", rank, world, fmt.Appendf(nil, "10.0.0.%d", rank+1))
			if err != nil {
				panic(err)
			}
			got[rank] = blobs
		}()
	}
	wg.Wait()
	fmt.Printf("%s\n", got[2])

	// A rank that never comes: the wait ends at the deadline, naming it.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := rendezvous.Barrier(ctx, store, "lonely", 0, 2)
	var missing *rendezvous.MissingRanksError
	fmt.Println(errors.Is(err, rendezvous.ErrTimeout), errors.As(err, &missing), missing.Missing)
	// Output:
	// [10.0.0.1 10.0.0.2 10.0.0.3]
	// true true [1]
}
