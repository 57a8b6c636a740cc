package rendezvous

import (
	"context"
	"errors"
	"testing"
	"time"
)

// storeKinds builds each Store implementation for the conformance tests.
// newPeer returns another handle on the same store (another "process").
type storeKind struct {
	name  string
	setup func(t *testing.T) (newPeer func() Store)
}

func storeKinds() []storeKind {
	return []storeKind{
		{"mem", func(t *testing.T) func() Store {
			s := NewMemStore()
			t.Cleanup(func() { s.Close() })
			return func() Store { return s }
		}},
		{"file", func(t *testing.T) func() Store {
			dir := t.TempDir()
			return func() Store {
				s, err := NewFileStore(dir)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
		}},
		{"tcp", func(t *testing.T) func() Store {
			srv := newTestServer(t, ServerOptions{Secret: []byte{}})
			return func() Store { return dialTest(t, srv, ClientOptions{Secret: []byte{}}) }
		}},
	}
}

func newTestServer(t *testing.T, opts ServerOptions) *Server {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	srv, err := NewTCPServer("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

func dialTest(t *testing.T, srv *Server, opts ClientOptions) Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := DialTCP(ctx, srv.Addr(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func short(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestMemWaitWokenByClose(t *testing.T) {
	s := NewMemStore()
	go func() { time.Sleep(20 * time.Millisecond); s.Close() }()
	if err := s.Wait(short(t, 5*time.Second), "never"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait = %v, want ErrClosed", err)
	}
}
