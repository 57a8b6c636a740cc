// Package etcdstore is a rendezvous.Store on an existing etcd cluster
// (v3 API), as torchrun's etcd rendezvous backend uses one: every key this
// handle writes is attached to a lease the handle keeps alive, so the keys
// of a rank that dies (or closes) expire TTL later instead of lingering.
//
// Importing the package registers the address schemes "etcd://" (plain)
// and "etcds://" (TLS) with rendezvous.Open, so `collgen run --store
// etcd://host:2379` and rendezvous.FromEnv in a program that imports it
// reach etcd. The etcd client (gRPC) is linked only into programs that
// import this package.
package etcdstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// Environment variables read for an "etcd://" or "etcds://" address.
const (
	// EnvCACert, EnvCert and EnvKey name PEM files for TLS ("etcds://"):
	// the CA that signed the servers' certificates (default: the system
	// pool) and a client certificate and key (optional).
	EnvCACert = "COLLGEN_ETCD_CACERT"
	EnvCert   = "COLLGEN_ETCD_CERT"
	EnvKey    = "COLLGEN_ETCD_KEY"
	// EnvUser and EnvPassword are etcd's user and password when the
	// cluster has authentication enabled.
	EnvUser     = "COLLGEN_ETCD_USER"
	EnvPassword = "COLLGEN_ETCD_PASSWORD"
)

// DefaultTTL is the lease of a handle's keys when Config.TTL is zero: a dead
// rank's keys disappear this long after its last keep-alive.
const DefaultTTL = 30 * time.Second

// DefaultPrefix is where keys live in etcd when Config.Prefix is empty.
const DefaultPrefix = "/collgen/"

// Config says how to reach etcd.
type Config struct {
	// Endpoints are the cluster's client URLs or host:port pairs.
	Endpoints []string
	// TLS, when non-nil, secures the connection (etcd's client TLS).
	TLS *tls.Config
	// Username and Password authenticate when the cluster has auth on.
	Username, Password string
	// Prefix is prepended to every key (default DefaultPrefix), so one
	// cluster can serve other users too. Open ends it with "/" if it does
	// not (Prefix "/jobs/a" keeps keys under "/jobs/a/"), so a prefix
	// never overlaps another that merely starts with it ("/jobs/ab").
	Prefix string
	// TTL is the lease of every key this handle writes (default
	// DefaultTTL; etcd raises values below its minimum, about 2 s).
	TTL time.Duration
	// DialTimeout bounds connecting (default 10 s; never past the
	// deadline of the ctx given to Open).
	DialTimeout time.Duration
}

func init() {
	rendezvous.RegisterScheme("etcd", func(ctx context.Context, rest string) (rendezvous.Store, error) {
		return openAddr(ctx, rest, false)
	})
	rendezvous.RegisterScheme("etcds", func(ctx context.Context, rest string) (rendezvous.Store, error) {
		return openAddr(ctx, rest, true)
	})
}

// ParseAddr reads the part of an etcd address after "etcd://" (or
// "etcds://" when secure): comma-separated host:port endpoints, then
// optionally "/prefix". Credentials and TLS files come from the
// COLLGEN_ETCD_* variables; an address holding them (user:pw@host) is
// refused, as are endpoints with a scheme or without a port.
func ParseAddr(rest string, secure bool) (Config, error) {
	if strings.Contains(rest, "://") {
		return Config{}, fmt.Errorf("etcdstore: address %q: endpoints take no scheme; want etcd://host:2379[,host2:2379][/prefix] (etcds:// for TLS)", rest)
	}
	hosts, prefix, _ := strings.Cut(rest, "/")
	if strings.Contains(hosts, "@") {
		// Not quoted: every error naming an endpoint would show them.
		return Config{}, fmt.Errorf("etcdstore: the address holds credentials (user:password@); set %s and %s instead", EnvUser, EnvPassword)
	}
	var cfg Config
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		scheme := "http://"
		if secure {
			scheme = "https://"
		}
		// The etcd client parses each endpoint as a URL: one that does
		// not parse back to this host:port ("h:+1", "[fe80::1%eth0]:1")
		// is refused here rather than failing there.
		_, port, err := net.SplitHostPort(h)
		if u, uerr := url.Parse(scheme + h); err != nil || !validPort(port) || uerr != nil || u.Host != h {
			return Config{}, fmt.Errorf("etcdstore: endpoint %q: want host:port, as in etcd://host:2379[,host2:2379][/prefix]", h)
		}
		cfg.Endpoints = append(cfg.Endpoints, scheme+h)
	}
	if len(cfg.Endpoints) == 0 {
		return Config{}, fmt.Errorf("etcdstore: address %q names no endpoint; want etcd://host:2379[,host2:2379][/prefix]", rest)
	}
	if prefix != "" {
		cfg.Prefix = "/" + strings.TrimSuffix(prefix, "/") + "/"
	}
	cfg.Username, cfg.Password = os.Getenv(EnvUser), os.Getenv(EnvPassword)
	if !secure {
		if os.Getenv(EnvCACert) != "" || os.Getenv(EnvCert) != "" {
			return Config{}, fmt.Errorf("etcdstore: %s or %s is set but the address is etcd://; use etcds:// for TLS", EnvCACert, EnvCert)
		}
		return cfg, nil
	}
	tc, err := tlsFromEnv()
	if err != nil {
		return Config{}, err
	}
	cfg.TLS = tc
	return cfg, nil
}

// validPort reports whether port is decimal digits naming a port from 1 to
// 65535 (strconv.Atoi alone takes "+1", which no URL does).
func validPort(port string) bool {
	if port == "" || strings.Trim(port, "0123456789") != "" {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p >= 1 && p <= 65535
}

// tlsFromEnv builds the client TLS configuration from the COLLGEN_ETCD_*
// file variables.
func tlsFromEnv() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca := os.Getenv(EnvCACert); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("etcdstore: %s: %w", EnvCACert, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcdstore: %s=%s holds no PEM certificate", EnvCACert, ca)
		}
	}
	cert, key := os.Getenv(EnvCert), os.Getenv(EnvKey)
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("etcdstore: set both %s and %s for a client certificate, or neither", EnvCert, EnvKey)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("etcdstore: client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

func openAddr(ctx context.Context, rest string, secure bool) (rendezvous.Store, error) {
	cfg, err := ParseAddr(rest, secure)
	if err != nil {
		return nil, err
	}
	return Open(ctx, cfg)
}

// store is one handle on etcd: a client and the lease its writes carry.
type store struct {
	cli    *clientv3.Client
	prefix string
	eps    string // the endpoints, for errors
	lease  clientv3.LeaseID
	// stop ends the keep-alive; after it the lease expires TTL later.
	stop      context.CancelFunc
	closeOnce sync.Once
	closed    chan struct{}
}

// Open connects to etcd, grants this handle's lease and keeps it alive
// until Close. Close does not revoke the lease: keys this handle wrote
// stay readable for TTL after it closes (a peer may still be reading
// them), exactly as they would after the process died.
func Open(ctx context.Context, cfg Config) (rendezvous.Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcdstore: Config.Endpoints is empty")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	} else if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("etcdstore: TTL %v: etcd leases count whole seconds; want at least 1s", cfg.TTL)
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	// The client's context outlives Open, so the caller's deadline bounds
	// connecting (and fetching an auth token) through DialTimeout.
	if dl, ok := ctx.Deadline(); ok {
		cfg.DialTimeout = max(min(cfg.DialTimeout, time.Until(dl)), time.Millisecond)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: cfg.Endpoints, TLS: cfg.TLS, Username: cfg.Username, Password: cfg.Password,
		DialTimeout: cfg.DialTimeout, Context: context.WithoutCancel(ctx), Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: connect to %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	gctx, cancel := rendezvous.WithDefaultTimeout(ctx, 0)
	defer cancel()
	grant, err := cli.Grant(gctx, int64((cfg.TTL+time.Second-1)/time.Second))
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcdstore: grant a lease on %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	kctx, stop := context.WithCancel(context.Background())
	alive, err := cli.KeepAlive(kctx, grant.ID)
	if err != nil {
		stop()
		cli.Close()
		return nil, fmt.Errorf("etcdstore: keep the lease alive: %w", err)
	}
	go func() {
		for range alive { // drain the responses until stop or Close
		}
	}()
	return &store{cli: cli, prefix: cfg.Prefix, eps: strings.Join(cfg.Endpoints, ","), lease: grant.ID, stop: stop, closed: make(chan struct{})}, nil
}

// op runs f with ctx bounded by the default timeout and maps errors:
// ErrClosed after Close, and a wrapped cause otherwise.
func (s *store) op(ctx context.Context, what string, f func(ctx context.Context) error) error {
	select {
	case <-s.closed:
		return rendezvous.ErrClosed
	default:
	}
	ctx, cancel := rendezvous.WithDefaultTimeout(ctx, 0)
	defer cancel()
	err := f(ctx)
	if err == nil {
		return nil
	}
	select {
	case <-s.closed:
		return rendezvous.ErrClosed
	default:
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// Past the deadline: ErrTimeout too, as the waits and the TCP
		// store's calls are.
		return fmt.Errorf("rendezvous: etcd %s at %s: %w (%w)", what, s.eps, rendezvous.CauseErr(ctx), rendezvous.ErrTimeout)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("rendezvous: etcd %s at %s: %w", what, s.eps, rendezvous.CauseErr(ctx))
	}
	return fmt.Errorf("rendezvous: etcd %s: %w", what, err)
}

func (s *store) Set(ctx context.Context, key string, value []byte) error {
	return s.op(ctx, "set "+strconv.Quote(key), func(ctx context.Context) error {
		_, err := s.cli.Put(ctx, s.prefix+key, string(value), clientv3.WithLease(s.lease))
		return sizeErr(value, err)
	})
}

// sizeErr says plainly that value was too large when etcd refused the
// request for its size: the server's "request is too large" (its
// --max-request-bytes, 1.5 MiB by default) or the client's gRPC send
// limit (2 MiB), which otherwise read as cryptic gRPC errors.
func sizeErr(value []byte, err error) error {
	if errors.Is(err, rpctypes.ErrRequestTooLarge) || status.Code(err) == codes.ResourceExhausted {
		return fmt.Errorf("value of %d bytes is over etcd's request limit (the server's --max-request-bytes, 1.5 MiB by default); store smaller values: %w", len(value), err)
	}
	return err
}

func (s *store) Get(ctx context.Context, key string) ([]byte, error) {
	vals, err := s.wait(ctx, []string{key})
	if err != nil {
		return nil, err
	}
	return vals[0], nil
}

func (s *store) Wait(ctx context.Context, keys ...string) error {
	_, err := s.wait(ctx, keys)
	return err
}

// wait returns the values of keys once all exist in one snapshot: it
// reads them together at one revision and, while one is missing, watches
// the first missing key from the next revision (so a write between the
// read and the watch is never lost).
func (s *store) wait(ctx context.Context, keys []string) ([][]byte, error) {
	select {
	case <-s.closed:
		return nil, rendezvous.ErrClosed
	default:
	}
	ctx, cancel := rendezvous.WithDefaultTimeout(ctx, 0)
	defer cancel()
	last := keys // missing at the last snapshot read
	for {
		vals, rev, missing, err := s.snapshot(ctx, keys)
		if err != nil {
			return nil, s.waitErr(ctx, keys, last, err)
		}
		if len(missing) == 0 {
			return vals, nil
		}
		last = missing
		if err := s.watchPut(ctx, missing[0], rev+1); err != nil {
			return nil, s.waitErr(ctx, keys, last, err)
		}
	}
}

// maxTxnOps is the most operations snapshot puts in one transaction:
// etcd's --max-txn-ops default, which refuses larger transactions with
// "too many operations in txn request" (a rendezvous waits for one key
// per rank, so a group of more than 128 ranks needs several).
const maxTxnOps = 128

// snapshot reads keys at one revision: the first maxTxnOps in one
// transaction, any others at that transaction's revision (all again if
// it is compacted meanwhile).
func (s *store) snapshot(ctx context.Context, keys []string) (vals [][]byte, rev int64, missing []string, err error) {
	vals = make([][]byte, len(keys))
	for start := 0; ; start += maxTxnOps {
		end := min(start+maxTxnOps, len(keys))
		ops := make([]clientv3.Op, end-start)
		for i, k := range keys[start:end] {
			if rev != 0 {
				ops[i] = clientv3.OpGet(s.prefix+k, clientv3.WithRev(rev))
			} else {
				ops[i] = clientv3.OpGet(s.prefix + k)
			}
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if rev != 0 && errors.Is(err, rpctypes.ErrCompacted) {
			// The revision was compacted between two transactions: read
			// all the keys again at a newer one.
			return s.snapshot(ctx, keys)
		}
		if err != nil {
			return nil, 0, nil, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for i, r := range resp.Responses {
			kvs := r.GetResponseRange().Kvs
			if len(kvs) == 0 {
				missing = append(missing, keys[start+i])
				continue
			}
			vals[start+i] = append([]byte{}, kvs[0].Value...)
		}
		if end == len(keys) {
			return vals, rev, missing, nil
		}
	}
}

// watchPut returns when key is written at or after revision rev.
func (s *store) watchPut(ctx context.Context, key string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range s.cli.Watch(wctx, s.prefix+key, clientv3.WithRev(rev)) {
		if resp.CompactRevision != 0 {
			return nil // history compacted: read again
		}
		if err := resp.Err(); err != nil {
			return err
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.PUT {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-s.closed:
		return rendezvous.ErrClosed
	default:
	}
	return nil // the watch ended (leader lost, reconnect): read again
}

// waitErr turns a failed wait into the store's errors: ErrClosed, a
// *rendezvous.WaitError naming the keys still missing at the deadline, a
// cancellation naming its cause, or etcd's error. last holds the keys
// missing at the last snapshot read.
func (s *store) waitErr(ctx context.Context, keys, last []string, err error) error {
	select {
	case <-s.closed:
		return rendezvous.ErrClosed
	default:
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		// One last look, bounded apart from the expired ctx (briefly: the
		// caller's deadline has passed), so the error names exactly what
		// is still missing.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 250*time.Millisecond)
		defer cancel()
		_, _, missing, lerr := s.snapshot(lctx, keys)
		if lerr != nil {
			// etcd is not answering: say so, with what was missing when
			// it last did.
			return fmt.Errorf("rendezvous: etcd at %s did not answer: %w", s.eps, &rendezvous.WaitError{Missing: last})
		}
		if len(missing) == 0 {
			missing = keys // arrived too late for this caller
		}
		return &rendezvous.WaitError{Missing: missing}
	case ctx.Err() != nil:
		return fmt.Errorf("rendezvous: waiting for %d keys: %w", len(keys), rendezvous.CauseErr(ctx))
	}
	return fmt.Errorf("rendezvous: etcd wait: %w", err)
}

func (s *store) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var n int64
	err := s.op(ctx, "add to "+strconv.Quote(key), func(ctx context.Context) error {
		for {
			resp, err := s.cli.Get(ctx, s.prefix+key)
			if err != nil {
				return err
			}
			cmp := clientv3.Compare(clientv3.CreateRevision(s.prefix+key), "=", 0)
			var cur int64
			if len(resp.Kvs) > 0 {
				kv := resp.Kvs[0]
				if cur, err = strconv.ParseInt(string(kv.Value), 10, 64); err != nil {
					return &counterError{key: key, value: kv.Value}
				}
				cmp = clientv3.Compare(clientv3.ModRevision(s.prefix+key), "=", kv.ModRevision)
			}
			if n, err = rendezvous.AddCounter(key, cur, delta); err != nil {
				return err
			}
			txn, err := s.cli.Txn(ctx).If(cmp).
				Then(clientv3.OpPut(s.prefix+key, strconv.FormatInt(n, 10), clientv3.WithLease(s.lease))).Commit()
			if err != nil {
				return err
			}
			if txn.Succeeded {
				return nil
			}
		}
	})
	var ce *counterError
	if errors.As(err, &ce) {
		return 0, ce
	}
	return n, err
}

// counterError reads as the other stores' error for Add on a value that
// is not a decimal counter.
type counterError struct {
	key   string
	value []byte
}

func (e *counterError) Error() string {
	return fmt.Sprintf("rendezvous: add to key %q: value %.32q is not a decimal integer", e.key, e.value)
}

func (s *store) CompareAndSet(ctx context.Context, key string, old, new []byte) ([]byte, bool, error) {
	var cur []byte
	var swapped bool
	err := s.op(ctx, "compare-and-set "+strconv.Quote(key), func(ctx context.Context) error {
		k := s.prefix + key
		cmp := clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
		if old != nil {
			// A value compare on an absent key fails, as it must.
			cmp = clientv3.Compare(clientv3.Value(k), "=", string(old))
		}
		resp, err := s.cli.Txn(ctx).If(cmp).
			Then(clientv3.OpPut(k, string(new), clientv3.WithLease(s.lease))).
			Else(clientv3.OpGet(k)).Commit()
		if err != nil {
			return sizeErr(new, err)
		}
		if swapped = resp.Succeeded; swapped {
			cur = append([]byte{}, new...)
			return nil
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			cur = append([]byte{}, kvs[0].Value...)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return cur, swapped, nil
}

func (s *store) Delete(ctx context.Context, key string) (bool, error) {
	var deleted bool
	err := s.op(ctx, "delete "+strconv.Quote(key), func(ctx context.Context) error {
		resp, err := s.cli.Delete(ctx, s.prefix+key)
		if err == nil {
			deleted = resp.Deleted > 0
		}
		return err
	})
	return deleted, err
}

// Close stops the keep-alive and the client. The lease is left to expire
// (see Open); Close is safe to call twice.
func (s *store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.closed)
		s.stop()
		err = s.cli.Close()
	})
	return err
}
