package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/etcdstore"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// startEtcd starts a one-member etcd server on loopback (free ports, a
// temporary data directory), stopped by the test's cleanup, and returns
// its client endpoint (host:port).
func startEtcd(t *testing.T) string {
	t.Helper()
	ep, _ := startEtcdStop(t)
	return ep
}

// startEtcdStop is startEtcd that also returns a function stopping the
// server early (a cluster dying under its clients).
func startEtcdStop(t *testing.T) (string, func()) {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	// Quiet: stopping logs its closed listeners at error level; start-up
	// errors come back from StartEtcd.
	cfg.LogLevel = "panic"
	cfg.Logger = "zap"
	client, peer := freeURL(t), freeURL(t)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			e.Close()
			<-e.Server.StopNotify()
		})
	}
	t.Cleanup(stop)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("embedded etcd did not become ready in 30s")
	}
	return client.Host, stop
}

// freeURL returns http://127.0.0.1:<a port free a moment ago>.
func freeURL(t *testing.T) url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}

func open(t *testing.T, cfg etcdstore.Config) rendezvous.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := etcdstore.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestConformance runs the Store conformance suite on etcd; every subtest
// gets a prefix of its own on one server.
func TestConformance(t *testing.T) {
	ep := startEtcd(t)
	n := 0
	storetest.Run(t, func(t *testing.T) func() rendezvous.Store {
		n++
		prefix := fmt.Sprintf("/test%d/", n)
		return func() rendezvous.Store { return open(t, etcdstore.Config{Endpoints: []string{ep}, Prefix: prefix}) }
	})
}

// TestDeadRankKeysExpire: a handle that stops keeping its lease alive (a
// dead rank; Close looks the same to etcd) loses its keys after the TTL,
// while a live handle's keys stay.
func TestDeadRankKeysExpire(t *testing.T) {
	ep := startEtcd(t)
	cfg := etcdstore.Config{Endpoints: []string{ep}, TTL: 2 * time.Second}
	dead, live := open(t, cfg), open(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dead.Set(ctx, "dead", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := live.Set(ctx, "live", []byte("1")); err != nil {
		t.Fatal(err)
	}
	dead.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := live.Wait(shortCtx(t, 200*time.Millisecond), "dead")
		if errors.Is(err, rendezvous.ErrTimeout) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead handle's key still exists 20s after it stopped (TTL 2s)")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // past a TTL: the live lease is kept alive
	if v, err := live.Get(shortCtx(t, time.Second), "live"); err != nil || string(v) != "1" {
		t.Fatalf("live handle's key: %q, %v", v, err)
	}
}

func shortCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestOpenByAddress: rendezvous.OpenRun reaches etcd through the
// registered etcd:// scheme, scoped by run id like a TCP store.
func TestOpenByAddress(t *testing.T) {
	ep := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := rendezvous.OpenRun(ctx, "etcd://"+ep+"/jobs/a", "run12345")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	raw := open(t, etcdstore.Config{Endpoints: []string{ep}, Prefix: "/jobs/a/"})
	if v, err := raw.Get(ctx, "collgen/run/run12345/k"); err != nil || string(v) != "v" {
		t.Fatalf("key under the run prefix: %q, %v", v, err)
	}
}

// Prefixes "/jobs/a" and "/jobs/ab" keep apart: Open ends a prefix with
// "/" (before, key "bk" under "/jobs/a" was key "k" under "/jobs/ab").
func TestPrefixesNeverOverlap(t *testing.T) {
	ep := startEtcd(t)
	ctx := context.Background()
	a := open(t, etcdstore.Config{Endpoints: []string{ep}, Prefix: "/jobs/a"})
	ab := open(t, etcdstore.Config{Endpoints: []string{ep}, Prefix: "/jobs/ab"})
	if err := a.Set(ctx, "bk", []byte("from a")); err != nil {
		t.Fatal(err)
	}
	if err := ab.Set(ctx, "k", []byte("from ab")); err != nil {
		t.Fatal(err)
	}
	if v, err := a.Get(ctx, "bk"); err != nil || string(v) != "from a" {
		t.Fatalf("a's key bk: %q, %v", v, err)
	}
	slash := open(t, etcdstore.Config{Endpoints: []string{ep}, Prefix: "/jobs/a/"})
	if v, err := slash.Get(ctx, "bk"); err != nil || string(v) != "from a" {
		t.Fatalf(`"/jobs/a" and "/jobs/a/" differ: %q, %v`, v, err)
	}
}

func TestParseAddr(t *testing.T) {
	cfg, err := etcdstore.ParseAddr("h1:2379,h2:2379/jobs/x/", false)
	if err != nil || strings.Join(cfg.Endpoints, " ") != "http://h1:2379 http://h2:2379" || cfg.Prefix != "/jobs/x/" || cfg.TLS != nil {
		t.Fatalf("ParseAddr = %+v, %v", cfg, err)
	}
	if cfg, err = etcdstore.ParseAddr("[::1]:2379,[fe80::1]:2379", false); err != nil || strings.Join(cfg.Endpoints, " ") != "http://[::1]:2379 http://[fe80::1]:2379" {
		t.Fatalf("ParseAddr(IPv6) = %+v, %v", cfg, err)
	}
	if cfg, err = etcdstore.ParseAddr("h1:2379", true); err != nil || cfg.Endpoints[0] != "https://h1:2379" || cfg.TLS == nil {
		t.Fatalf("ParseAddr(secure) = %+v, %v", cfg, err)
	}
	for _, c := range []struct {
		rest   string
		secure bool
		env    map[string]string
		want   string
	}{
		{"/x", false, nil, `etcdstore: address "/x" names no endpoint; want etcd://host:2379[,host2:2379][/prefix]`},
		{"h:1", false, map[string]string{etcdstore.EnvCACert: "/ca.pem"}, "etcdstore: COLLGEN_ETCD_CACERT or COLLGEN_ETCD_CERT is set but the address is etcd://; use etcds:// for TLS"},
		{"h:1", true, map[string]string{etcdstore.EnvCert: "/c.pem"}, "etcdstore: set both COLLGEN_ETCD_CERT and COLLGEN_ETCD_KEY for a client certificate, or neither"},
		{"h:1", true, map[string]string{etcdstore.EnvCACert: "/nonexistent/ca.pem"}, "etcdstore: COLLGEN_ETCD_CACERT: open /nonexistent/ca.pem: no such file or directory"},
		// etcdctl-style endpoints with a scheme were split at the
		// scheme's "//" into endpoint "http:" and prefix "//h1:2379/".
		{"http://h1:2379,http://h2:2379", false, nil, `etcdstore: address "http://h1:2379,http://h2:2379": endpoints take no scheme; want etcd://host:2379[,host2:2379][/prefix] (etcds:// for TLS)`},
		{"h1", false, nil, `etcdstore: endpoint "h1": want host:port, as in etcd://host:2379[,host2:2379][/prefix]`},
		{"h1:2379,h2:x", false, nil, `etcdstore: endpoint "h2:x": want host:port, as in etcd://host:2379[,host2:2379][/prefix]`},
		{"::1:2379", false, nil, `etcdstore: endpoint "::1:2379": want host:port, as in etcd://host:2379[,host2:2379][/prefix]`},
		// Accepted once (strconv.Atoi takes "+1"; SplitHostPort takes a
		// zone), then refused by the etcd client's URL parse:
		// FuzzParseAddr's seeds.
		{"h1:+2379", false, nil, `etcdstore: endpoint "h1:+2379": want host:port, as in etcd://host:2379[,host2:2379][/prefix]`},
		{"[fe80::1%eth0]:2379", false, nil, `etcdstore: endpoint "[fe80::1%eth0]:2379": want host:port, as in etcd://host:2379[,host2:2379][/prefix]`},
		// Credentials in the address would be echoed by every error
		// naming the endpoint; they belong in the environment.
		{"bob:hunter2@h1:2379", false, nil, "etcdstore: the address holds credentials (user:password@); set COLLGEN_ETCD_USER and COLLGEN_ETCD_PASSWORD instead"},
	} {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		_, err := etcdstore.ParseAddr(c.rest, c.secure)
		if fmt.Sprint(err) != c.want {
			t.Errorf("ParseAddr(%q, %v) error = %v, want %s", c.rest, c.secure, err, c.want)
		}
		for k := range c.env {
			t.Setenv(k, "")
		}
	}
}

func TestOpenUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{freeURL(t).Host}, DialTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "etcdstore: ") {
		t.Fatalf("Open on a closed port = %v, want an error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Open took %v", d)
	}
	if _, err := etcdstore.Open(ctx, etcdstore.Config{}); fmt.Sprint(err) != "etcdstore: Config.Endpoints is empty" {
		t.Fatalf("Open(empty) = %v", err)
	}
}

// TestOpenUnreachableWithAuth: with a user set the client fetches a token
// while connecting; that too must end by the caller's deadline (not the
// 10 s default DialTimeout), naming the endpoint and not the password.
func TestOpenUnreachableWithAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ep := freeURL(t).Host
	start := time.Now()
	_, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{ep}, Username: "bob", Password: "hunter2"})
	if err == nil || !strings.Contains(err.Error(), ep) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Open on a closed port = %v, want an error naming %s", err, ep)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Open took %v past a 1s deadline", d)
	}
}

// TestValueTooLarge: a value over etcd's request limit (1.5 MiB on the
// server, 2 MiB in the client's gRPC) fails saying so, not with gRPC's
// "ResourceExhausted" or a bare "request is too large".
func TestValueTooLarge(t *testing.T) {
	s := open(t, etcdstore.Config{Endpoints: []string{startEtcd(t)}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, n := range []int{1600 << 10, 3 << 20} {
		err := s.Set(ctx, "big", make([]byte, n))
		want := fmt.Sprintf(`rendezvous: etcd set "big": value of %d bytes is over etcd's request limit`, n)
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Set of %d bytes = %v, want %s...", n, err, want)
		}
		_, _, err = s.CompareAndSet(ctx, "big", nil, make([]byte, n))
		want = fmt.Sprintf(`rendezvous: etcd compare-and-set "big": value of %d bytes is over etcd's request limit`, n)
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("CompareAndSet of %d bytes = %v, want %s...", n, err, want)
		}
	}
	if err := s.Set(ctx, "ok", make([]byte, 1<<20)); err != nil {
		t.Fatalf("Set of 1 MiB: %v", err)
	}
}

// TestEtcdDiesMidRendezvous: when the cluster stops under a waiting rank,
// the wait ends by its deadline (not a second later), names the key still
// missing (not every key) and the endpoint that stopped answering; so do
// later operations.
func TestEtcdDiesMidRendezvous(t *testing.T) {
	ep, stop := startEtcdStop(t)
	s := open(t, etcdstore.Config{Endpoints: []string{ep}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := s.Set(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(500*time.Millisecond, stop)
	start := time.Now()
	err := s.Wait(ctx, "a", "b")
	var we *rendezvous.WaitError
	if !errors.As(err, &we) || strings.Join(we.Missing, ",") != "b" || !strings.Contains(err.Error(), ep) {
		t.Errorf("Wait while etcd stops = %v, want a timeout naming key b and %s", err, ep)
	}
	if d := time.Since(start); d > 3500*time.Millisecond {
		t.Errorf("Wait took %v past its 3s deadline", d)
	}
	start = time.Now()
	err = s.Set(shortCtx(t, time.Second), "c", []byte("1"))
	if err == nil || !strings.Contains(err.Error(), ep) {
		t.Errorf("Set on a stopped etcd = %v, want an error naming %s", err, ep)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("Set took %v past its 1s deadline", d)
	}
}
