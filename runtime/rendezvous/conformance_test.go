package rendezvous_test

import (
	"context"
	"testing"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// TestConformance runs the Store conformance suite on the in-memory, file
// and TCP stores; rendezvous/etcdstore runs it on etcd.
func TestConformance(t *testing.T) {
	t.Run("mem", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) func() rendezvous.Store {
			s := rendezvous.NewMemStore()
			t.Cleanup(func() { s.Close() })
			return func() rendezvous.Store { return s }
		})
	})
	t.Run("file", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) func() rendezvous.Store {
			dir := t.TempDir()
			return func() rendezvous.Store {
				s, err := rendezvous.NewFileStore(dir)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
		})
	})
	t.Run("tcp", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) func() rendezvous.Store {
			srv, err := rendezvous.NewTCPServer("127.0.0.1:0", rendezvous.ServerOptions{Secret: []byte{}, Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			return func() rendezvous.Store {
				s, err := rendezvous.DialTCP(context.Background(), srv.Addr(), rendezvous.ClientOptions{Secret: []byte{}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
		})
	})
}
