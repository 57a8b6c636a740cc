package rendezvous

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ClientOptions configures DialTCP. The zero value is usable.
type ClientOptions struct {
	// Secret proves the client to a server started with the same secret.
	// A nil Secret falls back to $COLLGEN_STORE_SECRET.
	Secret []byte
	// Timeout bounds operations whose ctx has no deadline, reconnects
	// included. Default DefaultTimeout.
	Timeout time.Duration
	// MaxFrameSize bounds responses (and requests). Default
	// DefaultMaxFrameSize.
	MaxFrameSize int
}

// Client reconnect backoff bounds.
const (
	retryMin = 20 * time.Millisecond
	retryMax = 500 * time.Millisecond
	// waitSlack is how long past the ctx deadline a client keeps a
	// connection open for the server's own timeout answer to a wait.
	waitSlack = 2 * time.Second
	maxIdle   = 4
)

// tcpClient is the Store returned by DialTCP. Each operation borrows an idle
// connection (or dials one), so concurrent operations do not queue behind a
// blocked Wait. On a network error it reconnects and retries until the ctx
// deadline; mutations carry the client id and a fresh sequence number, and
// the server answers a replayed (id, seq) from its memory instead of
// applying it again, so Add and CompareAndSet take effect exactly once.
type tcpClient struct {
	addr   string
	opts   ClientOptions
	secret []byte
	id     uint64
	seq    atomic.Uint64

	mu     sync.Mutex
	idle   []*clientConn
	busy   map[*clientConn]struct{} // lent to a call; Close closes them too
	closed bool
}

type clientConn struct {
	c   net.Conn
	r   *bufio.Reader
	max int // request size limit: the smaller of ours and the server's
}

// fatalError marks errors a retry cannot fix (authentication, oversize
// frames, server-side refusals).
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// DialTCP connects to the TCP store server at addr ("host:port" or
// "tcp://host:port"). It keeps retrying a refused connection until ctx's
// deadline (or opts.Timeout), so ranks may start before the server.
func DialTCP(ctx context.Context, addr string, opts ClientOptions) (Store, error) {
	addr = strings.TrimPrefix(addr, "tcp://")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("rendezvous: store address %q: %w (want host:port)", addr, err)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxFrameSize <= 0 {
		opts.MaxFrameSize = DefaultMaxFrameSize
	}
	secret := opts.Secret
	if secret == nil {
		secret = []byte(os.Getenv(EnvSecret))
	}
	var idb [8]byte
	rand.Read(idb[:])
	c := &tcpClient{addr: addr, opts: opts, secret: secret, id: binary.BigEndian.Uint64(idb[:])}
	ctx, cancel := WithDefaultTimeout(ctx, opts.Timeout)
	defer cancel()
	cc, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	c.put(cc)
	return c, nil
}

// connect dials until it succeeds, fails fatally, or ctx ends.
func (c *tcpClient) connect(ctx context.Context) (*clientConn, error) {
	delay := retryMin
	for {
		cc, err := c.dial(ctx)
		if err == nil {
			return cc, nil
		}
		var fe *fatalError
		if errors.As(err, &fe) {
			return nil, err
		}
		if err := c.sleep(ctx, delay, err); err != nil {
			return nil, err
		}
		delay = min(2*delay, retryMax)
	}
}

// sleep waits d, or returns an error naming lastErr when ctx ends first.
func (c *tcpClient) sleep(ctx context.Context, d time.Duration, lastErr error) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctxEnded(ctx, fmt.Sprintf("rendezvous: tcp store at %s unreachable: %v", c.addr, lastErr))
	}
}

// ctxEndedError is a call ended by its ctx: it matches ctx's error and,
// past a deadline, ErrTimeout, as the Store interface promises.
type ctxEndedError struct {
	msg string
	is  []error
}

func (e *ctxEndedError) Error() string   { return e.msg }
func (e *ctxEndedError) Unwrap() []error { return e.is }

// ctxEnded is the error of a call (what) that ctx ended: its text is
// what, then CauseErr(ctx).
func ctxEnded(ctx context.Context, what string) error {
	err := CauseErr(ctx)
	e := &ctxEndedError{msg: what + ": " + err.Error(), is: []error{err}}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		e.is = append(e.is, ErrTimeout)
	}
	return e
}

func (c *tcpClient) dial(ctx context.Context) (*clientConn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	dl := time.Now().Add(10 * time.Second)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	conn.SetDeadline(dl)
	cc := &clientConn{c: conn, r: bufio.NewReader(conn)}
	if err := c.handshake(cc); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return cc, nil
}

func (c *tcpClient) handshake(cc *clientConn) error {
	ch, err := readFrame(cc.r, 1024)
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if ch.Op != opChallenge || len(ch.Args) != 2 || len(ch.Args[1]) != 4 || ch.Num != protocolVersion {
		return &fatalError{fmt.Errorf("rendezvous: %s is not a collgen store (protocol version %d, op %d)", c.addr, ch.Num, ch.Op)}
	}
	// Never send more than the server accepts: it would hang up on us.
	cc.max = min(c.opts.MaxFrameSize, int(binary.BigEndian.Uint32(ch.Args[1])))
	var mac []byte
	if len(c.secret) > 0 {
		mac = authMAC(c.secret, ch.Args[0])
	}
	if err := writeFrame(cc.c, &frame{Op: opAuth, ID: c.id, Args: [][]byte{mac}}, c.opts.MaxFrameSize); err != nil {
		return err
	}
	resp, err := readFrame(cc.r, 1024)
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if resp.Op == statusAuth {
		return &fatalError{fmt.Errorf("%w: tcp store at %s refused this client; give the store and every rank the same %s", ErrAuth, c.addr, EnvSecret)}
	}
	if resp.Op != statusOK {
		return &fatalError{fmt.Errorf("rendezvous: tcp store at %s: unexpected handshake status %d", c.addr, resp.Op)}
	}
	return nil
}

// get borrows an idle connection or dials a new one.
func (c *tcpClient) get(ctx context.Context) (*clientConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if n := len(c.idle); n > 0 {
		cc := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.lend(cc)
		c.mu.Unlock()
		return cc, nil
	}
	c.mu.Unlock()
	cc, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed { // closed while dialling
		cc.c.Close()
		return nil, ErrClosed
	}
	c.lend(cc)
	return cc, nil
}

// lend records cc as in use by a call; mu is held.
func (c *tcpClient) lend(cc *clientConn) {
	if c.busy == nil {
		c.busy = map[*clientConn]struct{}{}
	}
	c.busy[cc] = struct{}{}
}

// drop forgets cc after a failed attempt and closes it.
func (c *tcpClient) drop(cc *clientConn) {
	c.mu.Lock()
	delete(c.busy, cc)
	c.mu.Unlock()
	cc.c.Close()
}

// put returns a healthy connection to the idle pool.
func (c *tcpClient) put(cc *clientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.busy, cc)
	if c.closed || len(c.idle) >= maxIdle {
		cc.c.Close()
		return
	}
	c.idle = append(c.idle, cc)
}

// do sends req and returns the server's response, reconnecting and
// retrying on network errors until ctx ends. Mutations get one sequence
// number for all their attempts so the server can dedupe replays.
func (c *tcpClient) do(ctx context.Context, req *frame) (*frame, error) {
	ctx, cancel := WithDefaultTimeout(ctx, c.opts.Timeout)
	defer cancel()
	isWait := req.Op == opGet || req.Op == opWait
	if !isWait {
		req.Seq = c.seq.Add(1)
	}
	req.ID = c.id
	delay := retryMin
	for {
		if ctx.Err() != nil && !isWait {
			return nil, ctxEnded(ctx, "rendezvous: tcp store at "+c.addr)
		}
		cc, err := c.get(ctx)
		if err == nil {
			var resp *frame
			resp, err = c.roundTrip(ctx, cc, req, isWait)
			if err == nil {
				c.put(cc)
				return resp, nil
			}
			c.drop(cc)
		}
		var fe *fatalError
		if errors.As(err, &fe) || errors.Is(err, ErrClosed) {
			return nil, err
		}
		if c.isClosed() { // Close cut the call's connection
			return nil, fmt.Errorf("rendezvous: tcp store at %s: %w", c.addr, ErrClosed)
		}
		if ctx.Err() == context.Canceled {
			return nil, fmt.Errorf("rendezvous: tcp store at %s: %w", c.addr, CauseErr(ctx))
		}
		if err := c.sleep(ctx, delay, err); err != nil {
			return nil, err
		}
		delay = min(2*delay, retryMax)
	}
}

// roundTrip runs one attempt on cc. A cancelled ctx aborts it at once; a
// passed deadline aborts non-waits, while a wait keeps waitSlack longer for
// the server's timeout answer (which names the missing keys).
func (c *tcpClient) roundTrip(ctx context.Context, cc *clientConn, req *frame, isWait bool) (*frame, error) {
	dl, _ := ctx.Deadline()
	if isWait {
		req.Num = max(time.Until(dl).Milliseconds(), 0)
		dl = dl.Add(waitSlack)
	}
	cc.c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() {
		if !isWait || ctx.Err() == context.Canceled {
			cc.c.SetDeadline(time.Unix(1, 0))
		}
	})
	defer stop()
	if err := writeFrame(cc.c, req, cc.max); err != nil {
		if errors.Is(err, errTooLarge) {
			return nil, &fatalError{err}
		}
		return nil, err
	}
	resp, err := readFrame(cc.r, c.opts.MaxFrameSize)
	if errors.Is(err, errOverLimit) {
		key := ""
		if len(req.Args) > 0 {
			key = fmt.Sprintf(" for key %q", req.Args[0])
		}
		return nil, &fatalError{fmt.Errorf("rendezvous: tcp store at %s: the response%s is larger than this client's MaxFrameSize (ClientOptions.MaxFrameSize); raise it: %w", c.addr, key, err)}
	}
	if err != nil {
		return nil, err
	}
	cc.c.SetDeadline(time.Time{})
	if resp.Op == statusError {
		msg := "unknown error"
		if len(resp.Args) > 0 {
			msg = string(resp.Args[0])
		}
		if !strings.HasPrefix(msg, "rendezvous: ") {
			msg = "rendezvous: " + msg
		}
		se := &serverError{msg: msg}
		switch resp.Num {
		case errCodeStoreFull:
			se.is = ErrStoreFull
		case errCodeCounterOverflow:
			se.is = ErrCounterOverflow
		}
		return nil, &fatalError{se}
	}
	return resp, nil
}

// serverError is a refusal the server sent: its message, wrapping the
// sentinel the server's error wrapped (nil for none).
type serverError struct {
	msg string
	is  error
}

func (e *serverError) Error() string { return e.msg }
func (e *serverError) Unwrap() error { return e.is }

func (c *tcpClient) Set(ctx context.Context, key string, value []byte) error {
	_, err := c.do(ctx, &frame{Op: opSet, Args: [][]byte{[]byte(key), value}})
	return err
}

func (c *tcpClient) Get(ctx context.Context, key string) ([]byte, error) {
	resp, err := c.do(ctx, &frame{Op: opGet, Args: [][]byte{[]byte(key)}})
	if err != nil {
		return nil, err
	}
	if resp.Op == statusTimeout {
		return nil, &WaitError{Missing: []string{key}}
	}
	if len(resp.Args) != 1 {
		return nil, fmt.Errorf("rendezvous: tcp store at %s: malformed get reply", c.addr)
	}
	return present(resp.Args[0]), nil
}

func (c *tcpClient) Wait(ctx context.Context, keys ...string) error {
	req := &frame{Op: opWait, Args: make([][]byte, len(keys))}
	for i, k := range keys {
		req.Args[i] = []byte(k)
	}
	resp, err := c.do(ctx, req)
	if err != nil {
		return err
	}
	if resp.Op == statusTimeout {
		we := &WaitError{Missing: make([]string, len(resp.Args))}
		for i, a := range resp.Args {
			we.Missing[i] = string(a)
		}
		return we
	}
	return nil
}

func (c *tcpClient) Add(ctx context.Context, key string, delta int64) (int64, error) {
	resp, err := c.do(ctx, &frame{Op: opAdd, Num: delta, Args: [][]byte{[]byte(key)}})
	if err != nil {
		return 0, err
	}
	return resp.Num, nil
}

func (c *tcpClient) CompareAndSet(ctx context.Context, key string, old, new []byte) ([]byte, bool, error) {
	req := &frame{Op: opCAS, Args: [][]byte{[]byte(key), old, new}}
	if old == nil {
		req.Flags |= flagOldAbsent
	}
	resp, err := c.do(ctx, req)
	if err != nil {
		return nil, false, err
	}
	if len(resp.Args) != 1 {
		return nil, false, fmt.Errorf("rendezvous: tcp store at %s: malformed compare-and-set reply", c.addr)
	}
	var cur []byte
	if resp.Flags&flagAbsent == 0 {
		cur = present(resp.Args[0])
	}
	return cur, resp.Flags&flagSwapped != 0, nil
}

func (c *tcpClient) Delete(ctx context.Context, key string) (bool, error) {
	resp, err := c.do(ctx, &frame{Op: opDelete, Args: [][]byte{[]byte(key)}})
	if err != nil {
		return false, err
	}
	return resp.Flags&flagExisted != 0, nil
}

// Close closes the client's connections, those of calls in progress too:
// a Get or Wait waiting then returns ErrClosed at once, as on the other
// stores.
func (c *tcpClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	for _, cc := range c.idle {
		cc.c.Close()
	}
	for cc := range c.busy {
		cc.c.Close()
	}
	c.idle = nil
	return nil
}

// isClosed reports whether Close has run.
func (c *tcpClient) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
