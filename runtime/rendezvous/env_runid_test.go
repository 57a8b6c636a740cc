package rendezvous

import (
	"context"
	"testing"
	"time"
)

// TestFromEnvTorchrunRunIDKeysRankZeroToo: under the torchrun fallback
// with COLLGEN_RUN_ID set (the docs: the run id keys the store whatever
// set the ranks up), rank 0, which serves the store, must key its own
// handle by the run id as ranks 1.. do, or the ranks never meet: rank 0
// waited under "collgen/..." while rank 1 wrote "collgen/run/<id>/collgen/...".
func TestFromEnvTorchrunRunIDKeysRankZeroToo(t *testing.T) {
	for _, k := range []string{"COLLGEN_RANK", "COLLGEN_WORLD_SIZE", "COLLGEN_LOCAL_RANK", "COLLGEN_STORE", "TORCHELASTIC_RUN_ID"} {
		t.Setenv(k, "")
		unsetenv(t, k)
	}
	t.Setenv(EnvSecret, "")
	t.Setenv(EnvRunID, "review42run")
	srv, err := NewTCPServer("127.0.0.1:0", ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	srv.Close() // free the port for rank 0
	t.Setenv("MASTER_ADDR", addr[:len("127.0.0.1")])
	t.Setenv("MASTER_PORT", addr[len("127.0.0.1:"):])
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
	if e0.RunID != "review42run" || e1.RunID != "review42run" {
		t.Fatalf("run ids %q, %q", e0.RunID, e1.RunID)
	}
	jctx, jcancel := context.WithTimeout(ctx, 2*time.Second)
	defer jcancel()
	errs := make(chan error, 1)
	go func() { errs <- Join(jctx, s1, "g", e1.Rank, e1.WorldSize) }()
	err0 := Join(jctx, s0, "g", e0.Rank, e0.WorldSize)
	err1 := <-errs
	if err0 != nil || err1 != nil {
		t.Fatalf("Join: rank 0: %v; rank 1: %v", err0, err1)
	}
	// And rank 1's keys are the run's: rank 0 reads them under the prefix.
	if err := s1.Set(ctx, "probe", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if v, err := s0.Get(short(t, time.Second), "probe"); err != nil || string(v) != "x" {
		t.Fatalf("rank 0 reads rank 1's key: %q, %v", v, err)
	}
}
