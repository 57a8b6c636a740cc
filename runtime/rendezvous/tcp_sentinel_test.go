package rendezvous

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestTCPErrorsKeepTheirSentinels: the errors a TCP store's server
// refuses a mutation with are the sentinels the package documents, as on
// the other stores: a value past ServerOptions.MaxStoreBytes is
// ErrStoreFull (documented for the TCP store above all, the only one with
// a limit) and an Add leaving int64 is ErrCounterOverflow. The client
// turned both into plain text, so errors.Is failed on them.
func TestTCPErrorsKeepTheirSentinels(t *testing.T) {
	srv := newTestServer(t, ServerOptions{Secret: []byte{}, MaxStoreBytes: 1 << 10})
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	ctx := short(t, 10*time.Second)

	err := s.Set(ctx, "big", make([]byte, 2<<10))
	if !errors.Is(err, ErrStoreFull) || !strings.Contains(err.Error(), "1024-byte limit") {
		t.Errorf("Set past MaxStoreBytes: %v; want ErrStoreFull naming the limit", err)
	}
	if _, _, err := s.CompareAndSet(ctx, "big", nil, make([]byte, 2<<10)); !errors.Is(err, ErrStoreFull) {
		t.Errorf("CompareAndSet past MaxStoreBytes: %v; want ErrStoreFull", err)
	}
	if _, err := s.Add(ctx, "n", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	_, err = s.Add(ctx, "n", 1)
	if !errors.Is(err, ErrCounterOverflow) || !strings.Contains(err.Error(), `"n"`) {
		t.Errorf("Add past MaxInt64: %v; want ErrCounterOverflow naming the key", err)
	}
	// Other refusals stay untyped, and the store keeps working.
	if err := s.Set(ctx, "text", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(ctx, "text", 1); err == nil || errors.Is(err, ErrCounterOverflow) || errors.Is(err, ErrStoreFull) {
		t.Errorf("Add to a non-decimal value: %v", err)
	}
	if v, err := s.Get(ctx, "n"); err != nil || string(v) != "9223372036854775807" {
		t.Errorf("Get after the refusals: %q, %v", v, err)
	}
}
