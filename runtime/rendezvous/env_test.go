package rendezvous

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

func lookupMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestReadEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Env
		err  string
	}{
		{"collgen", map[string]string{"COLLGEN_RANK": "2", "COLLGEN_WORLD_SIZE": "4", "COLLGEN_LOCAL_RANK": "1", "COLLGEN_STORE": "tcp://127.0.0.1:29500", "RANK": "9"},
			Env{Rank: 2, WorldSize: 4, LocalRank: 1, Store: "tcp://127.0.0.1:29500", Source: "collgen"}, ""},
		{"collgen file store, local rank defaults to rank", map[string]string{"COLLGEN_RANK": "1", "COLLGEN_WORLD_SIZE": "2", "COLLGEN_STORE": "file:///shared/rdzv"},
			Env{Rank: 1, WorldSize: 2, LocalRank: 1, Store: "file:///shared/rdzv", Source: "collgen"}, ""},
		{"torchrun", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"},
			Env{Rank: 0, WorldSize: 2, Store: "tcp://node0:29500", Source: "torchrun", HostStore: true}, ""},
		{"torchrun agent owns MASTER_PORT", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"},
			Env{Rank: 1, WorldSize: 2, LocalRank: 1, Store: "tcp://node0:29501", Source: "torchrun"}, ""},
		{"nothing", map[string]string{},
			Env{}, "rendezvous: no rank environment: set COLLGEN_RANK, COLLGEN_WORLD_SIZE and COLLGEN_STORE (`collgen run -n N -- prog` does this) or torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"},
		{"missing store", map[string]string{"COLLGEN_RANK": "0", "COLLGEN_WORLD_SIZE": "1"},
			Env{}, "rendezvous: COLLGEN_STORE is not set (want tcp://host:port or file:///path)"},
		{"bad rank", map[string]string{"COLLGEN_RANK": "x", "COLLGEN_WORLD_SIZE": "1", "COLLGEN_STORE": "tcp://h:1"},
			Env{}, `rendezvous: COLLGEN_RANK="x": want a non-negative integer`},
		{"rank out of range", map[string]string{"COLLGEN_RANK": "3", "COLLGEN_WORLD_SIZE": "2", "COLLGEN_STORE": "tcp://h:1"},
			Env{}, "rendezvous: rank 3 is out of range for world size 2 (want 0..1)"},
		{"bad scheme", map[string]string{"COLLGEN_RANK": "0", "COLLGEN_WORLD_SIZE": "1", "COLLGEN_STORE": "redis://h:1"},
			Env{}, `rendezvous: store address "redis://h:1": want tcp://host:port or file:///path`},
		{"torchrun without master", map[string]string{"RANK": "0", "WORLD_SIZE": "1"},
			Env{}, "rendezvous: RANK is set but MASTER_ADDR is not; set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readEnv(lookupMap(tc.env))
			if fmt.Sprint(err) != fmt.Sprint(tc.err) && !(err == nil && tc.err == "") {
				t.Fatalf("error = %v, want %s", err, tc.err)
			}
			if got != tc.want {
				t.Fatalf("env = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFromEnvTorchrunRankZeroHostsStore(t *testing.T) {
	for _, k := range []string{"COLLGEN_RANK", "COLLGEN_WORLD_SIZE", "COLLGEN_LOCAL_RANK", "COLLGEN_STORE", "TORCHELASTIC_RUN_ID"} {
		t.Setenv(k, "")
		unsetenv(t, k)
	}
	t.Setenv(SecretEnv, "")
	srv, err := NewTCPServer("127.0.0.1:0", ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	srv.Close() // free the port for rank 0
	host, port := addr[:len("127.0.0.1")], addr[len("127.0.0.1:"):]
	t.Setenv("MASTER_ADDR", host)
	t.Setenv("MASTER_PORT", port)
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("RANK", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e0, s0, err := FromEnv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s0.Close()
	t.Setenv("RANK", "1")
	e1, s1, err := FromEnv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	if !e0.HostStore || e1.HostStore {
		t.Fatalf("HostStore = %v, %v; want only rank 0", e0.HostStore, e1.HostStore)
	}
	errs := make(chan error, 1)
	go func() { errs <- Join(ctx, s1, "g", e1.Rank, e1.WorldSize) }()
	if err := Join(ctx, s0, "g", e0.Rank, e0.WorldSize); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// unsetenv removes k for the rest of the test; a t.Setenv of k before it
// restores the old value afterwards.
func unsetenv(t *testing.T, k string) {
	t.Helper()
	os.Unsetenv(k)
}
