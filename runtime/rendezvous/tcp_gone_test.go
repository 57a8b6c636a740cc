package rendezvous

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestTCPServerGoneTimeout: a TCP store call whose server has gone ends at
// its deadline with an error wrapping ErrTimeout, as the Store interface
// promises ("a wait ends with an error wrapping ErrTimeout when the ctx
// deadline passes"), and still context.DeadlineExceeded (TestTCPUnreachable).
// Before, Get, Wait, Set and Barrier ended with "tcp store ... unreachable:
// ...: context deadline exceeded", which errors.Is(err, ErrTimeout) did
// not match, unlike the file and etcd stores at their deadlines.
func TestTCPServerGoneTimeout(t *testing.T) {
	srv, err := NewTCPServer("127.0.0.1:0", ServerOptions{Secret: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	s := dialTest(t, srv, ClientOptions{Secret: []byte{}})
	srv.Close()
	for name, call := range map[string]func(ctx context.Context) error{
		"Get":     func(ctx context.Context) error { _, err := s.Get(ctx, "k"); return err },
		"Wait":    func(ctx context.Context) error { return s.Wait(ctx, "k") },
		"Set":     func(ctx context.Context) error { return s.Set(ctx, "k", []byte("v")) },
		"Barrier": func(ctx context.Context) error { return Barrier(ctx, s, "b", 0, 2) },
	} {
		start := time.Now()
		err := call(short(t, 300*time.Millisecond))
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with the server gone: %v; want ErrTimeout and context.DeadlineExceeded", name, err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%s took %v past a 300 ms deadline", name, d)
		}
	}
}
