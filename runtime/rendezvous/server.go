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
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// EnvSecret names the environment variable holding the shared secret that
// TCP servers and clients use when their options give none.
const EnvSecret = "COLLGEN_STORE_SECRET"

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
	statusError   uint8 = 2 // Args[0]: message; Num: the sentinel it wraps (errCode*), 0 for none
	statusAuth    uint8 = 3 // Args[0]: message; the server then hangs up
)

// Frame flags.
const (
	flagOldAbsent uint8 = 1 << 0 // CAS request: old is "key absent"
	flagSwapped   uint8 = 1 << 1 // CAS response
	flagExisted   uint8 = 1 << 2 // Delete response
	flagAbsent    uint8 = 1 << 3 // CAS response: current value is absent
	flagReread    uint8 = 1 << 4 // replay cache only: read the CAS value again (replayCopy); never sent
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
	// authenticate. Default 3s.
	HandshakeTimeout time.Duration
	// MaxConns bounds concurrent authenticated connections; a client that
	// authenticates beyond it is closed at once. Default 1024.
	MaxConns int
	// MaxHandshakes bounds connections still authenticating, separately
	// from MaxConns, so unauthenticated connections can never crowd out
	// authenticated ones. When full, a new connection evicts the oldest
	// pending one: an honest client authenticates within a round trip, so
	// a flood of idle connections only evicts itself. Default 64.
	MaxHandshakes int
	// MaxHandshakesPerPeer bounds the connections one remote IP may have
	// authenticating; beyond it the peer's own oldest is evicted. Loopback
	// peers (all of one host's ranks) are bound by MaxHandshakes alone.
	// Default 16.
	MaxHandshakesPerPeer int
	// IdleTimeout closes an authenticated connection with no request in
	// flight for this long (clients reconnect transparently when they next
	// need the store). Default 10 min; negative disables it.
	IdleTimeout time.Duration
	// FrameTimeout bounds how long the body of one request frame may take
	// to arrive once its length is read, and how long writing one response
	// may take: a client trickling bytes slower, or not reading its
	// responses (stopped, or hostile), is disconnected, and the bytes it
	// held go back to MaxInflightBytes. Default 30s.
	FrameTimeout time.Duration
	// MaxInflightBytes bounds the bytes of large frames (over 64 KiB) the
	// server holds at once, requests being read or applied and responses
	// being written: a reader waits for room before allocating. Small
	// frames are exempt, so trickled large frames cannot stall ordinary
	// traffic. Default max(4 x MaxFrameSize, 64 MiB).
	MaxInflightBytes int64
	// MaxStoreBytes bounds the keys and values the server holds; a Set,
	// Add or CompareAndSet past it fails with an error naming ErrStoreFull,
	// so clients storing huge values cannot grow the server without bound.
	// Default 256 MiB (rendezvous data is tiny: handles, addresses, ids).
	MaxStoreBytes int64
	// Insecure allows listening beyond loopback without a secret; without
	// it NewTCPServer refuses such a listener (ErrInsecure), because anyone
	// who can reach it could read and change the store.
	Insecure bool
	// Logf, if set, receives lines about dropped and refused clients and
	// other events, rate-limited (a burst of 10, then 2 a second; the next
	// line says how many were suppressed), so a flood cannot flood the log.
	Logf func(format string, args ...any)
}

// smallFrame is the size up to which frames bypass the in-flight budget.
const smallFrame = 64 << 10

// Server is a TCP store server. Any rank, `collgen run` or `collgen store`
// can run one; clients reach it with DialTCP.
type Server struct {
	ln     net.Listener
	opts   ServerOptions
	secret []byte
	data   *memStore

	mu      sync.Mutex
	conns   map[net.Conn]*connState
	pending []*connState // authenticating, oldest first
	authed  int          // authenticated connections
	clients map[uint64]*clientState
	closed  bool
	wg      sync.WaitGroup

	budget *byteBudget
	log    rateLogger

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
		opts.HandshakeTimeout = 3 * time.Second
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 1024
	}
	if opts.MaxHandshakes <= 0 {
		opts.MaxHandshakes = 64
	}
	if opts.MaxHandshakesPerPeer <= 0 {
		opts.MaxHandshakesPerPeer = 16
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = 10 * time.Minute
	}
	if opts.FrameTimeout <= 0 {
		opts.FrameTimeout = 30 * time.Second
	}
	if opts.MaxInflightBytes <= 0 {
		opts.MaxInflightBytes = max(4*int64(opts.MaxFrameSize), 64<<20)
	}
	if opts.MaxStoreBytes <= 0 {
		opts.MaxStoreBytes = 256 << 20
	}
	secret := opts.Secret
	if secret == nil {
		secret = []byte(os.Getenv(EnvSecret))
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, fmt.Errorf("rendezvous: tcp store: %w", err)
	}
	if len(secret) == 0 && !isLoopback(ln.Addr()) && !opts.Insecure {
		ln.Close()
		return nil, fmt.Errorf("%w: %s is reachable from other hosts; set %s (the same value for the server and every rank) or listen on 127.0.0.1", ErrInsecure, ln.Addr(), EnvSecret)
	}
	data := newMemStore(DefaultTimeout)
	data.limit = opts.MaxStoreBytes
	s := &Server{
		ln:      ln,
		opts:    opts,
		secret:  secret,
		data:    data,
		conns:   map[net.Conn]*connState{},
		clients: map[uint64]*clientState{},
		budget:  newByteBudget(opts.MaxInflightBytes),
		log:     rateLogger{logf: opts.Logf, burst: 10, every: 500 * time.Millisecond},
	}
	if len(secret) == 0 && !isLoopback(ln.Addr()) {
		s.logf("rendezvous: warning: store listening on %s without a secret; any host that can reach it can read and change it (set %s)", ln.Addr(), EnvSecret)
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
// ErrClosed and waits for the server's goroutines to end. A second Close
// does nothing and returns nil.
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
	s.budget.close()
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

func (s *Server) logf(format string, args ...any) { s.log.printf(format, args...) }

// connState is the server's view of one connection.
type connState struct {
	c     net.Conn
	peer  string // remote IP, "" for loopback (not limited per peer)
	since time.Time
	// evicted is set (under Server.mu) when the connection was closed to
	// make room for newer handshakes.
	evicted bool
}

func peerIP(c net.Conn) string {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ta.IP.IsLoopback() {
			return ""
		}
		return ta.IP.String()
	}
	return c.RemoteAddr().String()
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
			if errors.Is(err, net.ErrClosed) {
				return // listener closed
			}
			// Out of descriptors or similar: back off instead of spinning.
			s.logf("rendezvous: accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		cs := &connState{c: c, peer: peerIP(c), since: time.Now()}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.admitLocked(cs)
		s.conns[c] = cs
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			err := s.serve(cs)
			s.mu.Lock()
			delete(s.conns, c)
			evicted := cs.evicted
			s.mu.Unlock()
			c.Close()
			if err != nil && !evicted {
				s.logf("rendezvous: dropped client %s: %v", c.RemoteAddr(), err)
			}
		}()
	}
}

// admitLocked makes room for cs among the pending handshakes, evicting the
// peer's oldest when the peer is at its limit, else the oldest overall when
// all are taken, and appends cs. s.mu is held.
func (s *Server) admitLocked(cs *connState) {
	evict := func(i int) {
		old := s.pending[i]
		old.evicted = true
		old.c.Close()
		s.pending = append(s.pending[:i], s.pending[i+1:]...)
		s.logf("rendezvous: closed %s: still authenticating after %v while %d handshakes are pending",
			old.c.RemoteAddr(), time.Since(old.since).Round(time.Millisecond), len(s.pending)+1)
	}
	n, first := 0, -1
	for i, p := range s.pending {
		if cs.peer != "" && p.peer == cs.peer {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	if n >= s.opts.MaxHandshakesPerPeer {
		evict(first)
	} else if len(s.pending) >= s.opts.MaxHandshakes {
		evict(0)
	}
	s.pending = append(s.pending, cs)
}

// authenticated moves cs from the pending handshakes to the authenticated
// connections, or reports false when MaxConns are already authenticated
// (or cs was evicted meanwhile).
func (s *Server) authenticated(cs *connState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removePendingLocked(cs)
	if cs.evicted || s.authed >= s.opts.MaxConns {
		return false
	}
	s.authed++
	return true
}

func (s *Server) removePendingLocked(cs *connState) {
	for i, p := range s.pending {
		if p == cs {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			return
		}
	}
}

// serve runs one connection: handshake, then requests in order. A reader
// goroutine decodes frames so that a hang-up (or a bad frame) cancels a
// blocked wait at once. It returns why a misbehaving client was dropped, or
// nil for an ordinary hang-up.
func (s *Server) serve(cs *connState) error {
	c := cs.c
	id, err := s.handshake(c)
	if err != nil {
		s.mu.Lock()
		s.removePendingLocked(cs)
		s.mu.Unlock()
		if errors.Is(err, errHungUp) {
			return nil
		}
		return err
	}
	if !s.authenticated(cs) {
		if cs.evicted {
			return nil
		}
		return fmt.Errorf("refused: %d authenticated connections open", s.opts.MaxConns)
	}
	defer func() {
		s.mu.Lock()
		s.authed--
		s.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Idle watchdog: close the connection when no request has been in
	// flight for IdleTimeout. busy counts requests read but not yet
	// answered; last is when the count last changed.
	var (
		idleMu sync.Mutex
		busy   int
		last   = time.Now()
		idle   atomic.Bool
	)
	setBusy := func(d int) {
		idleMu.Lock()
		busy += d
		last = time.Now()
		idleMu.Unlock()
	}
	if s.opts.IdleTimeout > 0 {
		var t *time.Timer
		t = time.AfterFunc(s.opts.IdleTimeout, func() {
			idleMu.Lock()
			left := s.opts.IdleTimeout - time.Since(last)
			quiet := busy == 0 && left <= 0
			idleMu.Unlock()
			if quiet {
				idle.Store(true)
				c.Close()
				return
			}
			t.Reset(max(left, s.opts.IdleTimeout/10))
		})
		defer t.Stop()
	}

	type request struct {
		f    *frame
		held int64 // budget bytes to release once answered
	}
	reqs := make(chan request)
	var readErr error
	go func() {
		defer cancel()
		r := bufio.NewReader(c)
		for {
			f, held, err := s.readRequest(ctx, c, r)
			if err != nil {
				if errors.Is(err, errFrame) {
					readErr = err
				}
				return
			}
			setBusy(1)
			select {
			case reqs <- request{f, held}:
			case <-ctx.Done():
				s.budget.release(held)
				return
			}
		}
	}()
	w := bufio.NewWriter(c)
	for {
		var req request
		select {
		case req = <-reqs:
		case <-ctx.Done():
			c.Close() // unblocks the reader if we are the one stopping
			if idle.Load() {
				s.logf("rendezvous: closed idle client %s after %v", c.RemoteAddr(), s.opts.IdleTimeout)
				return nil
			}
			return readErr
		}
		req.f.ID = id // a client may only speak for itself
		resp, ok := s.handle(ctx, req.f)
		s.budget.release(req.held)
		if !ok {
			return nil // hang-up during a wait, or a test drop
		}
		// A client that does not read must not hold the in-flight budget
		// (or this goroutine) for good.
		c.SetWriteDeadline(time.Now().Add(s.opts.FrameTimeout))
		err := s.writeResponse(ctx, w, resp)
		setBusy(-1)
		if err != nil {
			if errors.Is(err, errTooLarge) {
				return err
			}
			return nil
		}
	}
}

// readRequest reads one frame, taking room in the in-flight budget for a
// large one before allocating it, and bounding the time its body may take.
// held is what the caller must release once the request is answered.
func (s *Server) readRequest(ctx context.Context, c net.Conn, r *bufio.Reader) (f *frame, held int64, err error) {
	n, err := readFrameLen(r, s.opts.MaxFrameSize)
	if err != nil {
		return nil, 0, err
	}
	if n > smallFrame {
		if err := s.budget.acquire(ctx, int64(n)); err != nil {
			return nil, 0, err
		}
		held = int64(n)
	}
	c.SetReadDeadline(time.Now().Add(s.opts.FrameTimeout))
	p := make([]byte, n)
	_, err = io.ReadFull(r, p)
	c.SetReadDeadline(time.Time{})
	if err == nil {
		f, err = decodeFrame(p)
	}
	if err != nil {
		s.budget.release(held)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("%w: a %d-byte frame did not arrive within %v", errFrame, n, s.opts.FrameTimeout)
		}
		return nil, 0, err
	}
	return f, held, nil
}

// writeResponse writes resp, holding room in the in-flight budget for a
// large one while it is encoded and sent.
func (s *Server) writeResponse(ctx context.Context, w *bufio.Writer, resp *frame) error {
	size := int64(encodedSize(resp))
	if size > smallFrame {
		if err := s.budget.acquire(ctx, size); err != nil {
			return err
		}
		defer s.budget.release(size)
	}
	if err := writeFrame(w, resp, s.opts.MaxFrameSize); err != nil {
		return err
	}
	return w.Flush()
}

// errHungUp is a client that closed its connection before it answered the
// handshake: an ordinary hang-up, not logged.
var errHungUp = errors.New("rendezvous: client hung up during the handshake")

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
		switch {
		case errors.Is(err, errFrame):
			return 0, err
		case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
			// Gone before a byte of its reply: a rank that exited while a
			// connection it no longer needed was opening, not a
			// misbehaving client (a silent one times out; a torn frame is
			// io.ErrUnexpectedEOF).
			return 0, errHungUp
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

// Error codes of a statusError reply (its Num): the sentinel the server's
// error wraps, so the client's error wraps it too (0: none).
const (
	errCodeStoreFull       int64 = 1 // ErrStoreFull
	errCodeCounterOverflow int64 = 2 // ErrCounterOverflow
)

// errorReply is the statusError reply for err, coded with its sentinel.
func errorReply(err error) *frame {
	f := errorFrame(err.Error())
	switch {
	case errors.Is(err, ErrStoreFull):
		f.Num = errCodeStoreFull
	case errors.Is(err, ErrCounterOverflow):
		f.Num = errCodeCounterOverflow
	}
	return f
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
	// Checked before the replay cache: a request reusing a (client, seq)
	// with other arguments reached the re-read below with none, and its
	// index out of range took the whole server down.
	if bad := argCountError(req); bad != nil {
		return bad, true
	}
	cs := s.client(req.ID)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	resp, seen := cs.done[req.Seq]
	switch {
	case !seen:
		resp = s.apply(ctx, req)
		cs.done[req.Seq] = replayCopy(req, resp)
		cs.order = append(cs.order, req.Seq)
		if len(cs.order) > dedupePerClient {
			delete(cs.done, cs.order[0])
			cs.order = cs.order[1:]
		}
	case resp.Flags&flagReread != 0:
		// A compare-and-set whose value was too large to keep: its
		// outcome (swapped or not) stands, its value is read again.
		r := *resp
		r.Flags &^= flagReread
		cur := s.data.peek(string(req.Args[0]))
		if cur == nil {
			r.Flags |= flagAbsent
		}
		r.Args = [][]byte{cur}
		resp = &r
	}
	if s.dropReply != nil && s.dropReply(req) {
		return nil, false
	}
	return resp, true
}

// replayKeep is the largest compare-and-set value the replay cache keeps;
// larger ones are read again on a replay (flagReread), so that the cache,
// up to dedupePerClient responses for each of maxClients clients, never
// holds copies of large values (200 failed compare-and-sets of a 2 MiB
// value held 400 MiB beside the store's own bound).
const replayKeep = 1 << 10

// replayCopy is what the replay cache keeps of resp: resp itself, or, for
// a compare-and-set with a value over replayKeep, its flags alone marked
// flagReread.
func replayCopy(req, resp *frame) *frame {
	if req.Op != opCAS || len(resp.Args) != 1 || len(resp.Args[0]) <= replayKeep {
		return resp
	}
	return &frame{Op: resp.Op, Flags: resp.Flags | flagReread, Num: resp.Num}
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

// argCountError is the error reply to a mutation with the wrong number of
// arguments for its op, or nil.
func argCountError(req *frame) *frame {
	want := map[uint8]int{opSet: 2, opAdd: 1, opCAS: 3, opDelete: 1}[req.Op]
	if len(req.Args) != want {
		return errorFrame(fmt.Sprintf("op %d takes %d arguments, got %d", req.Op, want, len(req.Args)))
	}
	return nil
}

// apply applies one mutation whose arguments argCountError accepted.
func (s *Server) apply(ctx context.Context, req *frame) *frame {
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
		return errorReply(err)
	}
	return resp
}
