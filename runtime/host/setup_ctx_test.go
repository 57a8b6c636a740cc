package host

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestSetupWaitHonoursCallersContext: a call that finds another goroutine
// of its rank in the lazy set-up (here waiting for rank 1, which never
// comes) waits for it, but only until its own context ends: Config.Timeout
// bounds a set-up step "when the context has no earlier deadline". It
// waited on the set-up lock for the other call's whole timeout (10 s),
// ignoring its 200 ms deadline and its cancellation.
func TestSetupWaitHonoursCallersContext(t *testing.T) {
	st := rendezvous.NewMemStore()
	defer st.Close()
	g, err := New(context.Background(), Config{Rank: 0, WorldSize: 2, Store: st, Group: t.Name(),
		Timeout: 10 * time.Second, Library: testLibrary})
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	testHook = func(rank int, point string) {
		if point == "setup:start" {
			close(entered)
		}
	}
	defer func() { testHook = nil }()
	first := make(chan error, 1)
	go func() { first <- g.Setup(context.Background()) }()
	<-entered

	buf := make([]byte, 64)
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 200*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		ctx, cancel := c.ctx()
		start := time.Now()
		err := g.AllReduce(ctx, buf, buf, 16, coll.F32, coll.Sum, Options{})
		took := time.Since(start)
		cancel()
		if took > 3*time.Second || !errors.Is(err, c.want) {
			t.Errorf("%s: AllReduce returned after %v with %v; want %v within about 200 ms", c.name, took.Round(time.Millisecond), err, c.want)
		}
		if c.want == context.DeadlineExceeded && !errors.Is(err, ErrTimeout) {
			t.Errorf("%s: %v is not ErrTimeout (a context's deadline is a timeout, as in barrier waits)", c.name, err)
		}
	}
	// The set-up itself goes on, unharmed by those calls, until Close.
	select {
	case err := <-first:
		t.Fatalf("the first call's set-up ended before Close: %v", err)
	default:
	}
	g.Close()
	if err := <-first; !errors.Is(err, ErrClosed) {
		t.Errorf("the first call's set-up: %v, want ErrClosed", err)
	}
}
