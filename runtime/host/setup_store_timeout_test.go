package host

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestSetupStoreGoneIsErrTimeout: the TCP store's server goes away before
// set-up. Set-up's store calls retry until the deadline (Config.Timeout)
// and fail with rendezvous.ErrTimeout; ErrTimeout's doc and
// docs/host-backend.md ("Every wait (store key, barrier, busy slot) ends
// by Timeout or the ctx deadline ... with ErrTimeout") promise the
// package's own sentinel. The nonce's CompareAndSet returned the store's
// error as it was, so errors.Is(err, host.ErrTimeout) was false, and the
// rank then also spent a second marking itself left in the dead store.
func TestSetupStoreGoneIsErrTimeout(t *testing.T) {
	srv, err := rendezvous.NewTCPServer("127.0.0.1:0", rendezvous.ServerOptions{Secret: []byte("s")})
	if err != nil {
		t.Fatal(err)
	}
	st, err := rendezvous.DialTCP(context.Background(), srv.Addr(), rendezvous.ClientOptions{Secret: []byte("s")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv.Close()
	const timeout = 500 * time.Millisecond
	g, err := New(context.Background(), Config{Rank: 0, WorldSize: 1, Store: st, Group: uniqueGroup(t), Library: testLibrary, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	start := time.Now()
	err = g.Setup(context.Background())
	took := time.Since(start)
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("Setup with the store's server gone: %v; want an error wrapping host.ErrTimeout", err)
	}
	if took > timeout+700*time.Millisecond {
		t.Errorf("Setup took %v with Config.Timeout %v", took, timeout)
	}
}
