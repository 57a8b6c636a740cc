//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// groupSeq keeps group names of one test binary apart.
var groupSeq atomic.Int64

func uniqueGroup(t *testing.T) string {
	return fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "."), os.Getpid(), groupSeq.Add(1))
}

// onRanks runs fn for every rank on its own goroutine and returns the
// errors, indexed by rank.
func onRanks(world int, fn func(r int) error) []error {
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}

// newPools forms a group of world goroutine ranks over one in-memory
// store; the pools are closed when the test ends.
func newPools(t *testing.T, world int, edit func(r int, c *Config)) []*Pool {
	t.Helper()
	st := rendezvous.NewMemStore()
	group := uniqueGroup(t)
	pools := make([]*Pool, world)
	errs := onRanks(world, func(r int) error {
		cfg := Config{Group: group, Rank: r, WorldSize: world, Store: st, Timeout: 20 * time.Second}
		if edit != nil {
			edit(r, &cfg)
		}
		p, err := NewPool(context.Background(), cfg)
		pools[r] = p
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: NewPool: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, p := range pools {
			if err := p.Close(); err != nil {
				t.Errorf("rank %d: Close: %v", p.Rank(), err)
			}
		}
	})
	return pools
}

// allocAll allocates n bytes on every rank and rendezvouses.
func allocAll(t *testing.T, pools []*Pool, n int) ([]*Buffer, []*Handle) {
	t.Helper()
	bufs := make([]*Buffer, len(pools))
	hs := make([]*Handle, len(pools))
	errs := onRanks(len(pools), func(r int) error {
		b, err := pools[r].Alloc(n)
		if err != nil {
			return err
		}
		bufs[r] = b
		hs[r], err = pools[r].Rendezvous(context.Background(), b)
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return bufs, hs
}

// checkErrs fails the test for every non-nil error.
func checkErrs(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// resources counts what a pool could leak in this process: open
// descriptors and memfd mappings of chunks.
type resources struct{ fds, maps int }

func countResources(t *testing.T) resources {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return resources{fds: len(ents), maps: strings.Count(string(maps), "/memfd:"+memfdName)}
}

// shmEntries lists /dev/shm names starting with memfdName. The host twin
// creates no names at all (memfds have none); other collgen packages'
// tests, which may run at the same time, create "collgen-<hash>" names.
func shmEntries(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), memfdName) {
			names = append(names, e.Name())
		}
	}
	return names
}

// eventually polls cond for up to 10s: resources released by goroutines
// that exit after Close returns (none should), or a descriptor the
// runtime closes lazily.
func eventually(cond func() bool) bool {
	for i := 0; i < 1000; i++ {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}
