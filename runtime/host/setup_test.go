package host

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/shm"
)

// TestEmptyPeerSegmentRemoved: a peer killed right after open(O_CREAT)
// of its segment, before fallocate, leaves an empty file. The survivor's
// failed set-up must remove it (it is ours: our uid, mode 0600) though its
// size is not the layout's, time out with ErrTimeout within its deadline,
// and leave nothing of the group in /dev/shm.
func TestEmptyPeerSegmentRemoved(t *testing.T) {
	const world = 2
	group := uniqueGroup(t)
	st := rendezvous.NewMemStore()
	defer st.Close()
	ctx := context.Background()
	st.Set(ctx, "collgen/host/"+group+"/nonce", []byte("feedface"))
	peer := shm.Posix{}.Path(SegmentName(group, world, "feedface", 1))
	if err := os.WriteFile(peer, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(peer)
	// The peer got as far as creating its file and publishing nothing.
	const timeout = 300 * time.Millisecond
	g, err := New(ctx, Config{Rank: 0, WorldSize: world, Store: st, Group: group, Shared: true, Library: testLibrary, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = g.Setup(ctx)
	took := time.Since(start)
	g.Close()
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Setup = %v, want ErrTimeout", err)
	}
	// Generous bound: the timeout covers each wait, not a CPU budget.
	if took > timeout+5*time.Second {
		t.Errorf("Setup failed after %v, timeout %v", took, timeout)
	}
	if l := leftovers(t, group, world); len(l) > 0 {
		t.Errorf("left in /dev/shm: %v", l)
	}
}
