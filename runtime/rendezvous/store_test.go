package rendezvous

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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
				return openFileStore(t, dir)
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

// TestFileStoreLockHolderStopped: a process that holds the file store's
// lock and stops (SIGSTOP; here another open file holds the flock) makes
// the others' Add, CompareAndSet, Delete and Set fail with ErrTimeout at
// their deadline instead of waiting for ever (they blocked in flock, and
// TestStoppedRankTimesOut's survivors hung once); released, the lock is
// taken again.
func TestFileStoreLockHolderStopped(t *testing.T) {
	dir := t.TempDir()
	s := openFileStore(t, dir)
	holder, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if ok, err := tryFlock(holder); !ok || err != nil {
		t.Fatalf("holder's flock: %v %v", ok, err)
	}
	ops := map[string]func(ctx context.Context) error{
		"Add":           func(ctx context.Context) error { _, err := s.Add(ctx, "n", 1); return err },
		"CompareAndSet": func(ctx context.Context) error { _, _, err := s.CompareAndSet(ctx, "k", nil, []byte("v")); return err },
		"Delete":        func(ctx context.Context) error { _, err := s.Delete(ctx, "k"); return err },
		"Set":           func(ctx context.Context) error { return s.Set(ctx, "k", []byte("v")) },
	}
	for name, op := range ops {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			done <- op(ctx)
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "still held") {
				t.Errorf("%s under a held lock: %v, want ErrTimeout", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s under a held lock still waits after 10 s (deadline 200 ms)", name)
		}
	}
	funlock(holder)
	if n, err := s.Add(context.Background(), "n", 1); err != nil || n != 1 {
		t.Errorf("Add after the lock was released: %d, %v", n, err)
	}
}

// TestFileStoreAddZeroReads: Add with delta 0 on a counter that exists
// reads it and leaves its file alone (an aborted communicator polls the
// members count so; each poll used to write a file into the directory),
// and on a missing key creates it at 0, as every store does.
func TestFileStoreAddZeroReads(t *testing.T) {
	st := openFileStore(t, t.TempDir())
	ctx := context.Background()
	if n, err := st.Add(ctx, "members", 5); err != nil || n != 5 {
		t.Fatalf("Add 5: %d, %v", n, err)
	}
	path := st.(*fileStore).path("members")
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := st.Add(ctx, "members", 0); err != nil || n != 5 {
		t.Fatalf("Add 0: %d, %v; want 5", n, err)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Error("Add 0 replaced the counter's file")
	}
	if n, err := st.Add(ctx, "fresh", 0); err != nil || n != 0 {
		t.Fatalf("Add 0 on a missing key: %d, %v", n, err)
	}
	if v, err := st.Get(ctx, "fresh"); err != nil || string(v) != "0" {
		t.Errorf("the missing key after Add 0: %q, %v; want \"0\"", v, err)
	}
}

// openFileStore opens a file store on dir for a test, closed at its end
// (before its temporary directories go).
func openFileStore(t testing.TB, dir string) Store {
	t.Helper()
	s, err := NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
