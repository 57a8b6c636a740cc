package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Environment variables set by `collgen run` for every rank.
const (
	EnvRank      = "COLLGEN_RANK"
	EnvWorldSize = "COLLGEN_WORLD_SIZE"
	EnvLocalRank = "COLLGEN_LOCAL_RANK"
	EnvStore     = "COLLGEN_STORE"
)

// Env is where a rank sits in its group and where the group's store is.
type Env struct {
	// Rank is this rank in the group, WorldSize the group's size, and
	// LocalRank this rank's index on its host (its GPU, as a rule).
	Rank, WorldSize, LocalRank int
	// Store is the store address: "tcp://host:port" or "file:///path".
	Store string
	// Source is "collgen" when the COLLGEN_* variables were used and
	// "torchrun" for the RANK/WORLD_SIZE/MASTER_* fallback.
	Source string
	// HostStore is true when this rank must serve the store itself: rank 0
	// under the torchrun fallback, where no collgen store is running.
	HostStore bool
	// RunID is the run's generation from COLLGEN_RUN_ID ("" when unset).
	// FromEnv keys the store by it, so a rerun on the same store never
	// sees this run's keys.
	RunID string
}

// ReadEnv reads the rank environment: COLLGEN_RANK, COLLGEN_WORLD_SIZE,
// COLLGEN_STORE and optionally COLLGEN_LOCAL_RANK (default: the rank); or,
// when no COLLGEN_* variable is set, torchrun's RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Under torchrun (TORCHELASTIC_RUN_ID
// set) MASTER_PORT belongs to torch's own store, so rank 0 serves the collgen
// store on MASTER_PORT+1 instead.
func ReadEnv() (Env, error) { return readEnv(os.LookupEnv) }

func readEnv(lookup func(string) (string, bool)) (Env, error) {
	// An empty variable counts as unset.
	has := func(k string) bool { v, _ := lookup(k); return v != "" }
	if has(EnvRank) || has(EnvWorldSize) || has(EnvStore) || has(EnvLocalRank) {
		return readCollgenEnv(lookup)
	}
	if has("RANK") || has("WORLD_SIZE") {
		return readTorchrunEnv(lookup)
	}
	return Env{}, errors.New("rendezvous: no rank environment: set COLLGEN_RANK, COLLGEN_WORLD_SIZE and COLLGEN_STORE " +
		"(`collgen run -n N -- prog` does this) or torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
}

// intVar reads a required (or, with def >= 0, optional) non-negative integer.
func intVar(lookup func(string) (string, bool), name string, def int) (int, error) {
	v, ok := lookup(name)
	if !ok || v == "" {
		if def >= 0 {
			return def, nil
		}
		return 0, fmt.Errorf("rendezvous: %s is not set", name)
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("rendezvous: %s=%q: want a non-negative integer", name, v)
	}
	return n, nil
}

func readCollgenEnv(lookup func(string) (string, bool)) (Env, error) {
	e := Env{Source: "collgen"}
	var err error
	if e.Rank, err = intVar(lookup, EnvRank, -1); err != nil {
		return Env{}, err
	}
	if e.WorldSize, err = intVar(lookup, EnvWorldSize, -1); err != nil {
		return Env{}, err
	}
	if e.LocalRank, err = intVar(lookup, EnvLocalRank, e.Rank); err != nil {
		return Env{}, err
	}
	e.Store, _ = lookup(EnvStore)
	if e.Store == "" {
		return Env{}, fmt.Errorf("rendezvous: %s is not set (want tcp://host:port, file:///path or etcd://host:port)", EnvStore)
	}
	if _, _, err := ParseStoreAddr(e.Store); err != nil {
		return Env{}, err
	}
	if err := checkRank(e.Rank, e.WorldSize); err != nil {
		return Env{}, err
	}
	if err := checkLocalRank(EnvLocalRank, e.LocalRank, e.WorldSize); err != nil {
		return Env{}, err
	}
	if e.RunID, err = runIDVar(lookup); err != nil {
		return Env{}, err
	}
	return e, nil
}

// checkLocalRank refuses a local rank that cannot be: at least the world
// size (a host holds at most the whole world).
func checkLocalRank(name string, local, world int) error {
	if local >= world {
		return fmt.Errorf("rendezvous: %s=%d: a local rank must be below the world size %d", name, local, world)
	}
	return nil
}

// runIDVar reads COLLGEN_RUN_ID, checked ("" when unset or empty).
func runIDVar(lookup func(string) (string, bool)) (string, error) {
	id, _ := lookup(EnvRunID)
	if id == "" {
		return "", nil
	}
	return id, CheckRunID(id)
}

func readTorchrunEnv(lookup func(string) (string, bool)) (Env, error) {
	e := Env{Source: "torchrun"}
	var err error
	if e.Rank, err = intVar(lookup, "RANK", -1); err != nil {
		return Env{}, err
	}
	if e.WorldSize, err = intVar(lookup, "WORLD_SIZE", -1); err != nil {
		return Env{}, err
	}
	if e.LocalRank, err = intVar(lookup, "LOCAL_RANK", e.Rank); err != nil {
		return Env{}, err
	}
	host, _ := lookup("MASTER_ADDR")
	if host == "" {
		return Env{}, errors.New("rendezvous: RANK is set but MASTER_ADDR is not; set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port")
	}
	port, err := intVar(lookup, "MASTER_PORT", -1)
	if err != nil {
		return Env{}, err
	}
	if port == 0 && e.WorldSize > 1 {
		return Env{}, errors.New("rendezvous: MASTER_PORT=0 with WORLD_SIZE > 1: the other ranks cannot know the port rank 0 would pick; set a free port")
	}
	if v, _ := lookup("TORCHELASTIC_RUN_ID"); v != "" { // empty counts as unset
		port++ // torchrun's agent serves its own TCPStore on MASTER_PORT
		if port > 65535 {
			return Env{}, fmt.Errorf("rendezvous: MASTER_PORT %d: under torchrun the collgen store serves on MASTER_PORT+1, past 65535; pick a lower MASTER_PORT", port-1)
		}
	}
	if port > 65535 {
		return Env{}, fmt.Errorf("rendezvous: MASTER_PORT %d is not a port (0-65535; 0 lets rank 0 pick one, for a world of one)", port)
	}
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	if h, _, err := net.SplitHostPort(hp); err != nil || h != host || strings.ContainsAny(host, " \t\n/") {
		return Env{}, fmt.Errorf("rendezvous: MASTER_ADDR %q is not a host name or address", host)
	}
	e.Store = "tcp://" + hp
	e.HostStore = e.Rank == 0
	if err := checkRank(e.Rank, e.WorldSize); err != nil {
		return Env{}, err
	}
	if err := checkLocalRank("LOCAL_RANK", e.LocalRank, e.WorldSize); err != nil {
		return Env{}, err
	}
	// The docs promise that COLLGEN_RUN_ID keys the store whatever set
	// the ranks up.
	if e.RunID, err = runIDVar(lookup); err != nil {
		return Env{}, err
	}
	return e, nil
}

// ParseStoreAddr splits a store address into its scheme ("tcp", "file" or
// a registered one such as "etcd") and the rest (host:port, an absolute
// path, or what the registered store parses). A bare host:port means tcp.
func ParseStoreAddr(addr string) (scheme, rest string, err error) {
	switch {
	case strings.HasPrefix(addr, "tcp://"):
		scheme, rest = "tcp", strings.TrimPrefix(addr, "tcp://")
	case strings.HasPrefix(addr, "file://"):
		scheme, rest = "file", strings.TrimPrefix(addr, "file://")
		if rest == "" || !strings.HasPrefix(rest, "/") {
			return "", "", fmt.Errorf("rendezvous: store address %q: want file:///absolute/path", addr)
		}
		return scheme, rest, nil
	case !strings.Contains(addr, "://"):
		scheme, rest = "tcp", addr
	default:
		scheme, rest, _ = strings.Cut(addr, "://")
		if _, ok := lookupScheme(scheme); !ok {
			return "", "", fmt.Errorf("rendezvous: store address %q: %s", redactUser(addr), schemeHelp(scheme))
		}
		if rest == "" || rest[0] == '/' {
			return "", "", fmt.Errorf("rendezvous: store address %q names no server; want %s://host:port", addr, scheme)
		}
		return scheme, rest, nil
	}
	_, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", "", fmt.Errorf("rendezvous: store address %q: %w (want tcp://host:port)", addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", "", fmt.Errorf("rendezvous: store address %q: port %q is not a number from 1 to 65535 (want tcp://host:port)", addr, port)
	}
	return scheme, rest, nil
}

// Opener opens a store of a registered scheme; rest is the address after
// "scheme://".
type Opener func(ctx context.Context, rest string) (Store, error)

var (
	schemesMu sync.Mutex
	schemes   = map[string]Opener{}
)

// RegisterScheme makes Open, OpenRun and FromEnv open addresses
// "scheme://..." with open. Packages providing a store with heavy
// dependencies register from init (rendezvous/etcdstore registers
// "etcd" and "etcds"), so only programs importing them link them.
// Registering tcp, file or a scheme twice panics: it is a programming
// error.
func RegisterScheme(scheme string, open Opener) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	if _, dup := schemes[scheme]; dup || scheme == "tcp" || scheme == "file" {
		panic("rendezvous: RegisterScheme called twice for " + scheme)
	}
	schemes[scheme] = open
}

func lookupScheme(scheme string) (Opener, bool) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	o, ok := schemes[scheme]
	return o, ok
}

// schemeHelp says why scheme cannot be opened: the etcd store is not
// linked in, or the scheme is unknown.
func schemeHelp(scheme string) string {
	if scheme == "etcd" || scheme == "etcds" {
		return "the etcd store is not linked into this program; import _ \"github.com/collgen/collgen/runtime/rendezvous/etcdstore\" (the collgen command has it unless built with -tags noetcd)"
	}
	return "want tcp://host:port, file:///path or etcd://host:port"
}

// Open connects to the store at addr: "tcp://host:port" (or bare
// "host:port") dials a TCP server with the secret from $COLLGEN_STORE_SECRET;
// "file:///path" opens a file store in that directory; any other scheme
// uses the store registered for it (RegisterScheme), such as
// "etcd://host:port" with rendezvous/etcdstore linked in.
func Open(ctx context.Context, addr string) (Store, error) {
	scheme, rest, err := ParseStoreAddr(addr)
	if err != nil {
		return nil, err
	}
	switch scheme {
	case "file":
		return NewFileStore(rest)
	case "tcp":
		return DialTCP(ctx, rest, ClientOptions{})
	}
	open, _ := lookupScheme(scheme)
	return open(ctx, rest)
}

// OpenRun opens the store at addr for one run: with a run id, a file store
// uses the run's own subdirectory (RunDir) and any other store keeps every
// key under "collgen/run/<id>/", so state left by an earlier run on the same
// store is never adopted. An empty runID is Open.
func OpenRun(ctx context.Context, addr, runID string) (Store, error) {
	if runID == "" {
		return Open(ctx, addr)
	}
	if err := CheckRunID(runID); err != nil {
		return nil, err
	}
	scheme, rest, err := ParseStoreAddr(addr)
	if err != nil {
		return nil, err
	}
	if scheme == "file" {
		return NewFileStore(RunDir(rest, runID))
	}
	s, err := Open(ctx, addr)
	if err != nil {
		return nil, err
	}
	return Scoped(s, runPrefix(runID)), nil
}

// runPrefix is the key prefix of a run's keys on a shared store (OpenRun;
// rank 0's hosted store in FromEnv keys its own handle the same way).
func runPrefix(runID string) string { return "collgen/run/" + runID + "/" }

// FromEnv reads the rank environment (see ReadEnv) and opens its store,
// keyed by the run id when COLLGEN_RUN_ID is set (see OpenRun). When
// env.HostStore is set this rank also serves the store, and closing the
// returned Store stops that server too; a store served beyond loopback
// needs $COLLGEN_STORE_SECRET (the same on every rank) and is refused
// without it. comm.New takes the Store and forms its group itself; code
// running rendezvous of its own on the Store calls Join first.
func FromEnv(ctx context.Context) (Env, Store, error) {
	e, err := ReadEnv()
	if err != nil {
		return Env{}, nil, err
	}
	if !e.HostStore {
		s, err := OpenRun(ctx, e.Store, e.RunID)
		return e, s, err
	}
	srv, err := NewTCPServer(e.Store, ServerOptions{})
	if errors.Is(err, ErrInsecure) {
		return Env{}, nil, fmt.Errorf("rendezvous: rank 0 cannot serve the store on %s (MASTER_ADDR is not a loopback address) without a secret: "+
			"set %s to the same random value on every rank (e.g. export %s=$(openssl rand -hex 16)), or set MASTER_ADDR=127.0.0.1 when all ranks run on this host: %w",
			e.Store, EnvSecret, EnvSecret, err)
	}
	if err != nil {
		return Env{}, nil, fmt.Errorf("rendezvous: rank 0 serving the store: %w", err)
	}
	s, err := DialTCP(ctx, srv.Addr(), ClientOptions{})
	if err != nil {
		srv.Close()
		return Env{}, nil, err
	}
	if e.RunID != "" { // keyed as OpenRun keys the other ranks' handles
		s = Scoped(s, runPrefix(e.RunID))
	}
	return e, &hostedStore{Store: s, srv: srv}, nil
}

// hostedStore is a client that also owns the server it talks to.
type hostedStore struct {
	Store
	srv *Server
}

func (h *hostedStore) Close() error { return errors.Join(h.Store.Close(), h.srv.Close()) }

// redactUser hides the user information of a scheme://user:pw@host
// address, so an error quoting it does not print a password.
func redactUser(addr string) string {
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		return addr
	}
	host := rest
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		host = rest[:i]
	}
	if i := strings.LastIndexByte(host, '@'); i >= 0 {
		return scheme + "://...@" + rest[i+1:]
	}
	return addr
}
