package host

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestSetupEndedAfterMappedFailsPeersFast: rank 1's set-up ends (its Close,
// or its call's context cancelled) after it published its mapped mark but
// before it saw rank 0's; rank 0 then finishes its set-up and runs a
// collective that waits for rank 1. Rank 1 left without a word in its
// segment (its failed set-up unmapped it before fail could set the abort
// word, and Close found no segment to mark closed), so rank 0 waited for
// its whole Config.Timeout and reported ErrTimeout. Close promises that "a
// peer still waiting for it fails fast": rank 0 must fail with
// ErrPeerFailed at once.
func TestSetupEndedAfterMappedFailsPeersFast(t *testing.T) {
	for _, shared := range []bool{false, true} {
		for _, how := range []string{"close", "cancel"} {
			t.Run(fmt.Sprintf("shared=%v/%s", shared, how), func(t *testing.T) {
				st := rendezvous.NewMemStore()
				defer st.Close()
				group := uniqueGroup(t)
				const timeout = 8 * time.Second
				mk := func(r int) *Group {
					g, err := New(context.Background(), Config{Rank: r, WorldSize: 2, Store: st, Group: group, Shared: shared,
						Library: testLibrary, Timeout: timeout})
					if err != nil {
						t.Fatal(err)
					}
					return g
				}
				g0, g1 := mk(0), mk(1)
				defer g0.Close()
				defer g1.Close()
				release, held := make(chan struct{}), make(chan struct{})
				testHook = func(rank int, point string) {
					if rank == 0 && point == "setup:mapped" {
						close(held)
						<-release // rank 0 publishes its mapped mark only once rank 1 has left
					}
				}
				defer func() { testHook = nil }()

				second := make(chan error, 1)
				var start time.Time
				buf0 := make([]byte, 64)
				go func() {
					second <- g0.AllReduce(context.Background(), buf0, buf0, 16, coll.F32, coll.Sum, Options{})
				}()
				ctx1, cancel1 := context.WithCancel(context.Background())
				defer cancel1()
				first := make(chan error, 1)
				buf1 := make([]byte, 64)
				go func() { first <- g1.AllReduce(ctx1, buf1, buf1, 16, coll.F32, coll.Sum, Options{}) }()
				if err := st.Wait(context.Background(), "collgen/host/"+group+"/mapped/r1"); err != nil {
					t.Fatal(err)
				}
				<-held // rank 0 has mapped rank 1's segment
				if how == "close" {
					go g1.Close()
				} else {
					cancel1()
				}
				if err := <-first; err == nil {
					t.Fatal("rank 1's call succeeded; the test wants its set-up ended")
				}
				start = time.Now()
				close(release)
				err := <-second
				took := time.Since(start)
				if !errors.Is(err, ErrPeerFailed) || took > timeout/2 {
					t.Errorf("rank 0's collective returned after %v with %v; want ErrPeerFailed at once", took.Round(time.Millisecond), err)
				}
				g0.Close()
				if l := leftovers(t, group, 2); len(l) != 0 {
					t.Errorf("left in /dev/shm: %v", l)
				}
			})
		}
	}
}
