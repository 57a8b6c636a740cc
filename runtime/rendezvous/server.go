package rendezvous

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// SecretEnv names the environment variable holding the shared secret that
// TCP servers and clients use when their options give none.
const SecretEnv = "COLLGEN_STORE_SECRET"

// ErrInsecure is returned (wrapped) by NewTCPServer for a listener beyond
// loopback without a secret, unless ServerOptions.Insecure says so.
var ErrInsecure = errors.New("rendezvous: refusing to serve beyond loopback without a secret")

// ErrAuth is returned (wrapped) by DialTCP when the server refuses the
// client's secret.
var ErrAuth = errors.New("rendezvous: authentication failed")

// Wire ops (requests) and statuses (responses).
const (
	opChallenge uint8 = 100 // server → client: Args nonce, max frame size (uint32); Num protocol version
	opAuth      uint8 = 101 // client → server: Args[0] HMAC of the nonce (empty without secret)

	opSet    uint8 = 1 // Args: key, value
	opGet    uint8 = 2 // Args: key; Num: wait budget in ms
	opWait   uint8 = 3 // Args: keys...; Num: wait budget in ms
	opAdd    uint8 = 4 // Args: key; Num: delta
	opCAS    uint8 = 5 // Args: key, old, new; Flags: flagOldAbsent
	opDelete uint8 = 6 // Args: key

	statusOK      uint8 = 0 // Args/Num/Flags: op results
	statusTimeout uint8 = 1 // Args: missing keys
	statusError   uint8 = 2 // Args[0]: message
	statusAuth    uint8 = 3 // Args[0]: message; the server then hangs up
)

// Frame flags.
const (
	flagOldAbsent uint8 = 1 << 0 // CAS request: old is "key absent"
	flagSwapped   uint8 = 1 << 1 // CAS response
	flagExisted   uint8 = 1 << 2 // Delete response
	flagAbsent    uint8 = 1 << 3 // CAS response: current value is absent
)

const protocolVersion = 1

// authContext is mixed into the HMAC so a MAC made for this protocol cannot
// be replayed as anything else.
const authContext = "collgen-rendezvous-v1\x00"

// Server limits on per-client replay state.
const (
	dedupePerClient = 256  // remembered responses per client
	maxClients      = 4096 // remembered client ids
)

// ServerOptions configures a TCP store server. The zero value is usable.
type ServerOptions struct {
	// Secret, if non-empty, must be proven by every client (HMAC of a
	// per-connection nonce; the secret itself never crosses the wire). A nil
	// Secret falls back to $COLLGEN_STORE_SECRET; an empty non-nil one turns
	// authentication off.
	Secret []byte
	// MaxFrameSize bounds a request's size; larger frames disconnect the
	// client. Default DefaultMaxFrameSize.
	MaxFrameSize int
	// HandshakeTimeout bounds how long a new connection may take to
	// authenticate. Default 10s.
	HandshakeTimeout time.Duration
	// MaxConns bounds concurrent connections; extra ones are closed at once.
	// Default 1024.
	MaxConns int
	// Insecure allows listening beyond loopback without a secret; without
	// it NewTCPServer refuses such a listener (ErrInsecure), because anyone
	// who can reach it could read and change the store.
	Insecure bool
	// Logf, if set, receives one line per dropped client and other events.
	Logf func(format string, args ...any)
}

// Server is a TCP store server. Any rank, `collgen run` or `collgen store`
// can run one; clients reach it with DialTCP.
type Server struct {
	ln     net.Listener
	opts   ServerOptions
	secret []byte
	data   *memStore

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	clients map[uint64]*clientState
	closed  bool
	wg      sync.WaitGroup

	// dropReply, if set (tests only), is asked after each applied request
	// whether to hang up instead of replying, simulating a lost response.
	dropReply func(req *frame) bool
}

// clientState remembers a client's recent mutating requests so a replay
// after a reconnect returns the first answer instead of applying twice.
type clientState struct {
	mu      sync.Mutex // held while a request of this client is applied
	done    map[uint64]*frame
	order   []uint64
	lastUse time.Time
}

// NewTCPServer listens on addr and serves in background goroutines until
// Close. A missing host (":29500", "") means 127.0.0.1: listening beyond
// loopback must be asked for explicitly (e.g. "0.0.0.0:29500"), and should
// come with a secret. Port 0 picks a free port; see Addr.
func NewTCPServer(addr string, opts ServerOptions) (*Server, error) {
	addr = strings.TrimPrefix(addr, "tcp://")
	host, port, err := net.SplitHostPort(addr)
	if addr == "" {
		host, port, err = "", "0", nil
	}
	if err != nil {
		return nil, fmt.Errorf("rendezvous: listen address %q: %w (want host:port)", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if opts.MaxFrameSize <= 0 {
		opts.MaxFrameSize = DefaultMaxFrameSize
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 1024
	}
	secret := opts.Secret
	if secret == nil {
		secret = []byte(os.Getenv(SecretEnv))
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, fmt.Errorf("rendezvous: tcp store: %w", err)
	}
	if len(secret) == 0 && !isLoopback(ln.Addr()) && !opts.Insecure {
		ln.Close()
		return nil, fmt.Errorf("%w: %s is reachable from other hosts; set %s (the same value for the server and every rank) or listen on 127.0.0.1", ErrInsecure, ln.Addr(), SecretEnv)
	}
	s := &Server{
		ln:      ln,
		opts:    opts,
		secret:  secret,
		data:    newMemStore(DefaultTimeout),
		conns:   map[net.Conn]struct{}{},
		clients: map[uint64]*clientState{},
	}
	if len(secret) == 0 && !isLoopback(ln.Addr()) {
		s.logf("rendezvous: warning: store listening on %s without a secret; any host that can reach it can read and change it (set %s)", ln.Addr(), SecretEnv)
	}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// Addr returns the address the server listens on, as "host:port" (prefix it
// with "tcp://" for COLLGEN_STORE).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops listening, disconnects every client, fails pending waits with
// ErrClosed and waits for the server's goroutines to end.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.data.Close()
	s.wg.Wait()
	return err
}

// dropConnections disconnects every client but keeps serving (tests use it
// to exercise client reconnects).
func (s *Server) dropConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.Close()
	}
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // listener closed
		}
		s.mu.Lock()
		if s.closed || len(s.conns) >= s.opts.MaxConns {
			s.mu.Unlock()
			s.logf("rendezvous: refusing %s: %d connections open", c.RemoteAddr(), s.opts.MaxConns)
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			err := s.serve(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
			if err != nil {
				s.logf("rendezvous: dropped client %s: %v", c.RemoteAddr(), err)
			}
		}()
	}
}

// serve runs one connection: handshake, then requests in order. A reader
// goroutine decodes frames so that a hang-up (or a bad frame) cancels a
// blocked wait at once. It returns why a misbehaving client was dropped, or
// nil for an ordinary hang-up.
func (s *Server) serve(c net.Conn) error {
	id, err := s.handshake(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reqs := make(chan *frame)
	var readErr error
	go func() {
		defer cancel()
		r := bufio.NewReader(c)
		for {
			f, err := readFrame(r, s.opts.MaxFrameSize)
			if err != nil {
				if errors.Is(err, errFrame) {
					readErr = err
				}
				return
			}
			select {
			case reqs <- f:
			case <-ctx.Done():
				return
			}
		}
	}()
	w := bufio.NewWriter(c)
	for {
		var req *frame
		select {
		case req = <-reqs:
		case <-ctx.Done():
			c.Close() // unblocks the reader if we are the one stopping
			return readErr
		}
		req.ID = id // a client may only speak for itself
		resp, ok := s.handle(ctx, req)
		if !ok {
			return nil // hang-up during a wait, or a test drop
		}
		if err := writeFrame(w, resp, s.opts.MaxFrameSize); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return nil
		}
	}
}

// handshake sends a nonce and checks the client's HMAC of it, returning the
// client's id.
func (s *Server) handshake(c net.Conn) (uint64, error) {
	c.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	defer c.SetDeadline(time.Time{})
	nonce := make([]byte, 32)
	rand.Read(nonce)
	limit := binary.BigEndian.AppendUint32(nil, uint32(s.opts.MaxFrameSize))
	if err := writeFrame(c, &frame{Op: opChallenge, Num: protocolVersion, Args: [][]byte{nonce, limit}}, s.opts.MaxFrameSize); err != nil {
		return 0, nil
	}
	// The reply is tiny; refuse anything large before authentication.
	f, err := readFrame(c, 1024)
	if err != nil {
		if errors.Is(err, errFrame) {
			return 0, err
		}
		return 0, fmt.Errorf("handshake: %w", err)
	}
	if f.Op != opAuth || len(f.Args) != 1 {
		return 0, fmt.Errorf("%w: expected an auth frame, got op %d with %d args", errFrame, f.Op, len(f.Args))
	}
	if len(s.secret) > 0 && !hmac.Equal(f.Args[0], authMAC(s.secret, nonce)) {
		writeFrame(c, &frame{Op: statusAuth, Args: [][]byte{[]byte("wrong or missing secret")}}, s.opts.MaxFrameSize)
		return 0, errors.New("authentication failed: wrong or missing secret")
	}
	if err := writeFrame(c, &frame{Op: statusOK}, s.opts.MaxFrameSize); err != nil {
		return 0, nil
	}
	return f.ID, nil
}

// authMAC is the client's proof of the secret for one nonce.
func authMAC(secret, nonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(authContext))
	m.Write(nonce)
	return m.Sum(nil)
}

// handle applies one request. ok is false when the connection should be
// dropped without a reply.
func (s *Server) handle(ctx context.Context, req *frame) (resp *frame, ok bool) {
	switch req.Op {
	case opGet, opWait:
		return s.handleWait(ctx, req)
	case opSet, opAdd, opCAS, opDelete:
		return s.handleMutation(ctx, req)
	}
	return errorFrame(fmt.Sprintf("unknown op %d", req.Op)), true
}

func errorFrame(msg string) *frame {
	return &frame{Op: statusError, Args: [][]byte{[]byte(msg)}}
}

func (s *Server) handleWait(ctx context.Context, req *frame) (*frame, bool) {
	if req.Op == opGet && len(req.Args) != 1 {
		return errorFrame("get takes one key"), true
	}
	keys := make([]string, len(req.Args))
	for i, a := range req.Args {
		keys[i] = string(a)
	}
	budget := time.Duration(max(req.Num, 0)) * time.Millisecond
	wctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	var v []byte
	var then func()
	if req.Op == opGet {
		then = func() { v = present(s.data.data[keys[0]]) }
	}
	err := s.data.waitFor(wctx, keys, then)
	var we *WaitError
	switch {
	case err == nil:
		resp := &frame{Op: statusOK}
		if req.Op == opGet {
			resp.Args = [][]byte{v}
		}
		return resp, true
	case errors.As(err, &we):
		resp := &frame{Op: statusTimeout, Args: make([][]byte, len(we.Missing))}
		for i, k := range we.Missing {
			resp.Args[i] = []byte(k)
		}
		return resp, true
	case ctx.Err() != nil, errors.Is(err, ErrClosed):
		return nil, false // the client hung up, or the server is closing
	default:
		return errorFrame(err.Error()), true
	}
}

// handleMutation applies Set/Add/CAS/Delete at most once per (client, seq).
func (s *Server) handleMutation(ctx context.Context, req *frame) (*frame, bool) {
	cs := s.client(req.ID)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	resp, seen := cs.done[req.Seq]
	if !seen {
		resp = s.apply(ctx, req)
		cs.done[req.Seq] = resp
		cs.order = append(cs.order, req.Seq)
		if len(cs.order) > dedupePerClient {
			delete(cs.done, cs.order[0])
			cs.order = cs.order[1:]
		}
	}
	if s.dropReply != nil && s.dropReply(req) {
		return nil, false
	}
	return resp, true
}

// client returns the replay state for id, forgetting the least recently
// used client when too many are remembered.
func (s *Server) client(id uint64) *clientState {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := s.clients[id]
	if cs == nil {
		if len(s.clients) >= maxClients {
			var oldest uint64
			var t time.Time
			for k, v := range s.clients {
				if t.IsZero() || v.lastUse.Before(t) {
					oldest, t = k, v.lastUse
				}
			}
			delete(s.clients, oldest)
		}
		cs = &clientState{done: map[uint64]*frame{}}
		s.clients[id] = cs
	}
	cs.lastUse = time.Now()
	return cs
}

func (s *Server) apply(ctx context.Context, req *frame) *frame {
	want := map[uint8]int{opSet: 2, opAdd: 1, opCAS: 3, opDelete: 1}[req.Op]
	if len(req.Args) != want {
		return errorFrame(fmt.Sprintf("op %d takes %d arguments, got %d", req.Op, want, len(req.Args)))
	}
	key := string(req.Args[0])
	resp := &frame{Op: statusOK}
	var err error
	switch req.Op {
	case opSet:
		err = s.data.Set(ctx, key, req.Args[1])
	case opAdd:
		resp.Num, err = s.data.Add(ctx, key, req.Num)
	case opCAS:
		old := req.Args[1]
		if req.Flags&flagOldAbsent != 0 {
			old = nil
		} else {
			old = present(old)
		}
		var cur []byte
		var swapped bool
		cur, swapped, err = s.data.CompareAndSet(ctx, key, old, req.Args[2])
		if swapped {
			resp.Flags |= flagSwapped
		}
		if cur == nil {
			resp.Flags |= flagAbsent
		}
		resp.Args = [][]byte{cur}
	case opDelete:
		var existed bool
		existed, err = s.data.Delete(ctx, key)
		if existed {
			resp.Flags |= flagExisted
		}
	}
	if err != nil {
		return errorFrame(err.Error())
	}
	return resp
}
