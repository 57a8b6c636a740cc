package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
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
		{"run id", map[string]string{"COLLGEN_RANK": "0", "COLLGEN_WORLD_SIZE": "1", "COLLGEN_STORE": "file:///s", "COLLGEN_RUN_ID": "0123abcd4567ef89"},
			Env{Rank: 0, WorldSize: 1, Store: "file:///s", Source: "collgen", RunID: "0123abcd4567ef89"}, ""},
		{"bad run id", map[string]string{"COLLGEN_RANK": "0", "COLLGEN_WORLD_SIZE": "1", "COLLGEN_STORE": "file:///s", "COLLGEN_RUN_ID": "../x"},
			Env{}, `rendezvous: COLLGEN_RUN_ID="../x": want 8 to 16 letters and digits (collgen run sets a fresh one per run)`},
		{"nothing", map[string]string{},
			Env{}, "rendezvous: no rank environment: set COLLGEN_RANK, COLLGEN_WORLD_SIZE and COLLGEN_STORE (`collgen run -n N -- prog` does this) or torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"},
		{"missing store", map[string]string{"COLLGEN_RANK": "0", "COLLGEN_WORLD_SIZE": "1"},
			Env{}, "rendezvous: COLLGEN_STORE is not set (want tcp://host:port, file:///path or etcd://host:port)"},
		{"bad rank", map[string]string{"COLLGEN_RANK": "x", "COLLGEN_WORLD_SIZE": "1", "COLLGEN_STORE": "tcp://h:1"},
			Env{}, `rendezvous: COLLGEN_RANK="x": want a non-negative integer`},
		{"rank out of range", map[string]string{"COLLGEN_RANK": "3", "COLLGEN_WORLD_SIZE": "2", "COLLGEN_STORE": "tcp://h:1"},
			Env{}, "rendezvous: rank 3 is out of range for world size 2 (want 0..1)"},
		{"bad scheme", map[string]string{"COLLGEN_RANK": "0", "COLLGEN_WORLD_SIZE": "1", "COLLGEN_STORE": "redis://h:1"},
			Env{}, `rendezvous: store address "redis://h:1": want tcp://host:port, file:///path or etcd://host:port`},
		{"etcd not linked", map[string]string{"COLLGEN_RANK": "0", "COLLGEN_WORLD_SIZE": "1", "COLLGEN_STORE": "etcd://h:1"},
			Env{}, `rendezvous: store address "etcd://h:1": the etcd store is not linked into this program; import _ "github.com/collgen/collgen/runtime/rendezvous/etcdstore" (the collgen command has it unless built with -tags noetcd)`},
		{"etcd not linked, password hidden", map[string]string{"COLLGEN_RANK": "0", "COLLGEN_WORLD_SIZE": "1", "COLLGEN_STORE": "etcd://me:secret@h:1/run"},
			Env{}, `rendezvous: store address "etcd://...@h:1/run": the etcd store is not linked into this program; import _ "github.com/collgen/collgen/runtime/rendezvous/etcdstore" (the collgen command has it unless built with -tags noetcd)`},
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

// TestFromEnvTorchrunRankZeroHostsStore: under torchrun's variables rank 0
// serves the store and the ranks meet through it, with and without
// COLLGEN_RUN_ID (the run id keys the store whatever set the ranks up:
// rank 0 once kept its own handle unscoped, and the ranks never met,
// reliability case 104).
func TestFromEnvTorchrunRankZeroHostsStore(t *testing.T) {
	for _, runID := range []string{"", "run42abc"} {
		t.Run("runid="+runID, func(t *testing.T) { torchrunRanksMeet(t, runID) })
	}
}

func torchrunRanksMeet(t *testing.T, runID string) {
	for _, k := range []string{"COLLGEN_RANK", "COLLGEN_WORLD_SIZE", "COLLGEN_LOCAL_RANK", "COLLGEN_STORE", "TORCHELASTIC_RUN_ID"} {
		t.Setenv(k, "")
		unsetenv(t, k)
	}
	t.Setenv(EnvSecret, "")
	t.Setenv(EnvRunID, runID)
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
	if e0.RunID != runID || e1.RunID != runID {
		t.Fatalf("run ids %q, %q; want %q", e0.RunID, e1.RunID, runID)
	}
	jctx, jcancel := context.WithTimeout(ctx, 2*time.Second)
	defer jcancel()
	errs := make(chan error, 1)
	go func() { errs <- Join(jctx, s1, "g", e1.Rank, e1.WorldSize) }()
	err0 := Join(jctx, s0, "g", e0.Rank, e0.WorldSize)
	if err1 := <-errs; err0 != nil || err1 != nil {
		t.Fatalf("Join: rank 0: %v; rank 1: %v", err0, err1)
	}
	// Rank 1's keys are rank 0's: both handles under the same prefix.
	if err := s1.Set(ctx, "probe", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if v, err := s0.Get(short(t, time.Second), "probe"); err != nil || string(v) != "x" {
		t.Fatalf("rank 0 reads rank 1's key: %q, %v", v, err)
	}
}

// unsetenv removes k for the rest of the test; a t.Setenv of k before it
// restores the old value afterwards.
func unsetenv(t *testing.T, k string) {
	t.Helper()
	os.Unsetenv(k)
}

// TestFromEnvTorchrunOpenStoreNeedsSecret: rank 0 under torchrun with a
// MASTER_ADDR beyond loopback refuses to serve an open store, naming the
// variable to set; with the secret set it serves.
func TestFromEnvTorchrunOpenStoreNeedsSecret(t *testing.T) {
	for _, k := range []string{"COLLGEN_RANK", "COLLGEN_WORLD_SIZE", "COLLGEN_LOCAL_RANK", "COLLGEN_STORE", "TORCHELASTIC_RUN_ID"} {
		t.Setenv(k, "")
		unsetenv(t, k)
	}
	t.Setenv(EnvSecret, "")
	t.Setenv("MASTER_ADDR", "0.0.0.0") // every interface: not loopback
	t.Setenv("MASTER_PORT", "0")
	t.Setenv("WORLD_SIZE", "1")
	t.Setenv("RANK", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, s, err := FromEnv(ctx)
	if !errors.Is(err, ErrInsecure) || !strings.Contains(err.Error(), "set "+EnvSecret) || !strings.Contains(err.Error(), "MASTER_ADDR=127.0.0.1") {
		t.Fatalf("FromEnv = %v, want ErrInsecure naming %s", err, EnvSecret)
	}
	if s != nil {
		t.Fatal("a store came back with the error")
	}
	t.Setenv(EnvSecret, "s3cret")
	_, s, err = FromEnv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// TestNewTCPServerRefusesOpenNonLoopback: listening beyond loopback needs
// a secret or an explicit Insecure.
func TestNewTCPServerRefusesOpenNonLoopback(t *testing.T) {
	if _, err := NewTCPServer("0.0.0.0:0", ServerOptions{Secret: []byte{}}); !errors.Is(err, ErrInsecure) {
		t.Fatalf("NewTCPServer = %v, want ErrInsecure", err)
	}
	srv, err := NewTCPServer("0.0.0.0:0", ServerOptions{Secret: []byte{}, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	srv, err = NewTCPServer("127.0.0.1:0", ServerOptions{Secret: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
}

// TestRunScopedStores: two runs on one file store or one TCP server never
// see each other's keys, and a timeout names keys as the caller wrote them.
func TestRunScopedStores(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dir := t.TempDir()
	srv, err := NewTCPServer("127.0.0.1:0", ServerOptions{Secret: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, addr := range []string{"file://" + dir, "tcp://" + srv.Addr()} {
		t.Run(addr[:3], func(t *testing.T) {
			old, err := OpenRun(ctx, addr, "run00001")
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			if err := Join(ctx, old, "g", 0, 1); err != nil {
				t.Fatal(err)
			}
			old.Set(ctx, "stale", []byte("x"))
			cur, err := OpenRun(ctx, addr, "run00002")
			if err != nil {
				t.Fatal(err)
			}
			defer cur.Close()
			// The old run's join would make this a duplicate rank.
			if err := Join(ctx, cur, "g", 0, 1); err != nil {
				t.Fatalf("second run adopted the first one's keys: %v", err)
			}
			wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer wcancel()
			err = cur.Wait(wctx, "stale")
			var we *WaitError
			if !errors.As(err, &we) || fmt.Sprint(we.Missing) != "[stale]" {
				t.Fatalf("Wait = %v, want a timeout naming \"stale\"", err)
			}
			if _, err := OpenRun(ctx, addr, "bad id!"); err == nil {
				t.Fatal("accepted a bad run id")
			}
		})
	}
	if _, err := os.Stat(RunDir(dir, "run00001")); err != nil {
		t.Fatalf("file store run directory: %v", err)
	}
}

// TestEnvPortsAndHosts: store addresses whose port does not exist, and a
// torchrun MASTER_PORT whose collgen store port (MASTER_PORT+1 under
// torchelastic) would not, or a MASTER_ADDR that is no host, are refused
// when the environment is read, not at the dial (FuzzEnv found the last
// two).
func TestEnvPortsAndHosts(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{EnvRank: "0", EnvWorldSize: "2", EnvStore: "tcp://h:99999"}, "port \"99999\""},
		{map[string]string{EnvRank: "0", EnvWorldSize: "2", EnvStore: "h:http"}, "port \"http\""},
		{map[string]string{EnvRank: "0", EnvWorldSize: "2", EnvStore: "tcp://h:0"}, "port \"0\""},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "65535", "TORCHELASTIC_RUN_ID": "r"}, "MASTER_PORT+1"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT 70000"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "]", "MASTER_PORT": "29500"}, "MASTER_ADDR \"]\""},
	} {
		_, err := readEnv(func(k string) (string, bool) { v, ok := c.env[k]; return v, ok })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %s", c.env, err, c.want)
		}
	}
}

// TestReadEnvGaps: COLLGEN_RUN_ID counts under torchrun too (checked and
// kept); an empty TORCHELASTIC_RUN_ID counts as unset (no MASTER_PORT+1);
// MASTER_PORT=0 with more than one rank, and local ranks at or past the
// world size, are refused.
func TestReadEnvGaps(t *testing.T) {
	torch := map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range torch {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	e, err := readEnv(lookupMap(with(map[string]string{EnvRunID: "job42abc"})))
	if err != nil || e.RunID != "job42abc" {
		t.Errorf("torchrun with %s: %+v, %v; want the run id kept", EnvRunID, e, err)
	}
	if _, err := readEnv(lookupMap(with(map[string]string{EnvRunID: "bad!"}))); err == nil {
		t.Errorf("torchrun with %s=bad!: accepted", EnvRunID)
	}
	if e, err := readEnv(lookupMap(with(map[string]string{"TORCHELASTIC_RUN_ID": ""}))); err != nil || e.Store != "tcp://h:29500" {
		t.Errorf("empty TORCHELASTIC_RUN_ID: %+v, %v; want the store on MASTER_PORT", e, err)
	}
	for _, c := range []map[string]string{
		with(map[string]string{"MASTER_PORT": "0"}),
		with(map[string]string{"LOCAL_RANK": "9"}),
		{EnvRank: "0", EnvWorldSize: "2", EnvLocalRank: "5", EnvStore: "tcp://h:1"},
	} {
		if e, err := readEnv(lookupMap(c)); err == nil {
			t.Errorf("%v: accepted as %+v", c, e)
		}
	}
}
