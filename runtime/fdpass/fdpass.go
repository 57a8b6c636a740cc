//go:build linux

// Package fdpass moves file descriptors between processes of one user over
// Unix domain sockets: SOCK_SEQPACKET sockets in Linux's abstract
// namespace (no file to clean up: the name vanishes with the last
// descriptor, even when the process is killed), descriptors carried as
// SCM_RIGHTS control messages, and both ends checked with SO_PEERCRED so a
// descriptor is never handed to, or accepted from, another user's process.
// Abstract names belong to a network namespace: both ends must share one.
//
// A Conn carries messages: a payload of at most MaxPayload bytes plus up to
// MaxFiles descriptors. Received descriptors are close-on-exec and owned by
// the caller, who must Close them. A Server (Listener.Serve) answers each
// accepted connection in a goroutine of its own: symmetric memory's pools
// serve memory descriptors with it, package ipc CUDA IPC handles.
package fdpass

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// MaxPayload is the largest payload a message carries.
const MaxPayload = 64 << 10

// MaxFiles is the most descriptors one message carries.
const MaxFiles = 16

// ErrForeignUser is wrapped by Dial and Accept when the process at the other
// end runs as another user: its connection is closed, and nothing is sent
// to it or taken from it.
var ErrForeignUser = errors.New("fdpass: peer runs as another user")

// ErrInvalidArgument is wrapped by refusals of a caller's argument: a
// payload or descriptor count out of range, a nil or closed file to send, a
// nil, zero, closed or already served Listener, a nil Conn, context or
// handler, a timeout that is not positive, a socket name prefix too long.
// Nothing was done; the message names the value and what is allowed.
var ErrInvalidArgument = errors.New("fdpass: invalid argument")

// invalidf formats an error wrapping ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// Cred is the identity of the process at the other end of a connection,
// as the kernel recorded it when the connection was made (SO_PEERCRED).
type Cred struct {
	PID int // its process id
	UID int // its user id
	GID int // its group id
}

// CheckPeer returns an error wrapping ErrForeignUser unless c.UID is uid.
// It is the whole policy: same user, or refused; root gets no exemption,
// because a root rank handing memory to a user's process is just as wrong.
func CheckPeer(c Cred, uid int) error {
	if c.UID != uid {
		return fmt.Errorf("%w: pid %d has uid %d, this process has uid %d; refusing to exchange descriptors with it",
			ErrForeignUser, c.PID, c.UID, uid)
	}
	return nil
}

// Listener accepts connections from processes of the caller's user on an
// abstract Unix socket.
type Listener struct {
	ln     *net.UnixListener
	addr   string
	closed atomic.Bool // Close was called
	served atomic.Bool // Serve took it
}

// MaxPrefix is the longest name prefix Listen takes: an abstract socket
// name holds at most 107 bytes, 16 of which are Listen's random digits.
const MaxPrefix = 107 - 16

// Listen opens a listener on a fresh abstract socket whose name starts with
// prefix (at most MaxPrefix bytes) and ends with 16 random hex digits. The
// name is only a rendezvous point: anyone in the network namespace may
// connect, which is why Accept checks the caller's uid.
func Listen(prefix string) (*Listener, error) {
	if len(prefix) > MaxPrefix {
		return nil, invalidf("Listen: prefix of %d bytes: at most %d (MaxPrefix)", len(prefix), MaxPrefix)
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	addr := "@" + prefix + hex.EncodeToString(rnd[:])
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("fdpass: listen on %s: %w", addr, err)
	}
	return &Listener{ln: ln, addr: addr}, nil
}

// Addr is the socket's name, "@" followed by the abstract name, as Dial
// takes it.
func (l *Listener) Addr() string { return l.addr }

// Accept waits for a connection. A connection from another user's process
// is closed and reported as an error wrapping ErrForeignUser; the listener
// stays usable, so callers skip such errors. Once the listener is closed,
// Accept returns an error wrapping net.ErrClosed.
func (l *Listener) Accept() (*Conn, error) {
	if err := l.check("Accept"); err != nil {
		return nil, err
	}
	c, err := l.ln.AcceptUnix()
	if err != nil {
		return nil, err
	}
	return checked(c)
}

// Close stops listening; the abstract name is released at once.
// Connections already accepted stay open.
func (l *Listener) Close() error {
	if err := l.check("Close"); err != nil {
		return err
	}
	l.closed.Store(true)
	return l.ln.Close()
}

// check refuses a nil Listener, or one not made by Listen.
func (l *Listener) check(op string) error {
	if l == nil || l.ln == nil {
		return invalidf("%s on a nil Listener (or one not made by Listen)", op)
	}
	return nil
}

// Server answers the connections a Listener accepts, each with a handler
// in a goroutine of its own (Listener.Serve).
type Server struct {
	ln      *Listener
	timeout time.Duration
	handle  func(*Conn)

	mu    sync.Mutex
	done  bool
	conns map[*Conn]struct{} // being handled; Close closes them
	wg    sync.WaitGroup     // the accept loop and the handlers
	once  sync.Once
	err   error
}

// Serve starts answering l's connections: each accepted connection (of
// this user's processes only; others are refused by Accept and skipped)
// gets a deadline timeout (positive) ahead and is handed to handle in its
// own goroutine, and is closed when handle returns. The Server owns l from
// now on: close the Server, not l. A nil or closed Listener, one already
// served, a nil handle or a timeout that is not positive is refused
// (ErrInvalidArgument) before anything starts; l then stays the caller's.
func (l *Listener) Serve(timeout time.Duration, handle func(*Conn)) (*Server, error) {
	if err := l.check("Serve"); err != nil {
		return nil, err
	}
	switch {
	case handle == nil:
		return nil, invalidf("Serve on %s: nil handler", l.addr)
	case timeout <= 0:
		return nil, invalidf("Serve on %s: timeout %v: want a positive per-connection deadline", l.addr, timeout)
	case l.closed.Load():
		return nil, invalidf("Serve on %s: the listener is closed", l.addr)
	case !l.served.CompareAndSwap(false, true):
		return nil, invalidf("Serve on %s: the listener is already served (a Server owns it)", l.addr)
	}
	s := &Server{ln: l, timeout: timeout, handle: handle, conns: map[*Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the listener's Addr.
func (s *Server) Addr() string { return s.ln.Addr() }

// accept runs until the listener closes.
func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Another user's process (already refused and closed), or a
			// transient failure such as running out of descriptors: keep
			// serving, without spinning on the latter.
			if !errors.Is(err, ErrForeignUser) {
				time.Sleep(10 * time.Millisecond)
			}
			continue
		}
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

// serve runs the handler on c and closes it.
func (s *Server) serve(c *Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	c.SetDeadline(time.Now().Add(s.timeout))
	s.handle(c)
}

// Close stops serving: the abstract name is released, connections still
// being handled are closed (their handlers' Send and Recv fail), and
// Close returns once every handler has returned. Idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.done = true
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.err = s.ln.Close()
		s.wg.Wait()
	})
	return s.err
}

// Dial connects to a Listener's Addr and checks that the listener runs as
// the caller's user. ctx (not nil) bounds the connect.
func Dial(ctx context.Context, addr string) (*Conn, error) {
	if ctx == nil {
		return nil, invalidf("Dial %s: nil context", addr)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", addr)
	if err != nil {
		return nil, fmt.Errorf("fdpass: connect to %s: %w", addr, err)
	}
	return checked(c.(*net.UnixConn))
}

// checked wraps c after checking its peer's uid; it closes c on failure.
func checked(c *net.UnixConn) (*Conn, error) {
	cred, err := peerCred(c)
	if err == nil {
		err = CheckPeer(cred, os.Geteuid())
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return &Conn{c: c, peer: cred}, nil
}

// peerCred reads SO_PEERCRED from c's socket.
func peerCred(c *net.UnixConn) (Cred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return Cred{}, err
	}
	var uc *syscall.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		uc, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return Cred{}, err
	}
	if serr != nil {
		return Cred{}, fmt.Errorf("fdpass: read peer credentials: %w", serr)
	}
	return Cred{PID: int(uc.Pid), UID: int(uc.Uid), GID: int(uc.Gid)}, nil
}

// Conn is one checked connection.
type Conn struct {
	c    *net.UnixConn
	peer Cred
}

// Peer is the identity of the process at the other end.
func (c *Conn) Peer() Cred { return c.peer }

// SetDeadline bounds every later Send and Recv.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.check("SetDeadline"); err != nil {
		return err
	}
	return c.c.SetDeadline(t)
}

// Close closes the connection.
func (c *Conn) Close() error {
	if err := c.check("Close"); err != nil {
		return err
	}
	return c.c.Close()
}

// check refuses a nil Conn, or one not made by Dial or Accept.
func (c *Conn) check(op string) error {
	if c == nil || c.c == nil {
		return invalidf("%s on a nil Conn (or one not made by Dial or Accept)", op)
	}
	return nil
}

// Send sends payload (1..MaxPayload bytes) with files' descriptors (at
// most MaxFiles, each open). The receiver gets duplicates; files stay open
// and owned by the caller.
func (c *Conn) Send(payload []byte, files ...*os.File) error {
	if err := c.check("Send"); err != nil {
		return err
	}
	if len(payload) == 0 || len(payload) > MaxPayload {
		return invalidf("Send: payload of %d bytes: want 1..%d", len(payload), MaxPayload)
	}
	if len(files) > MaxFiles {
		return invalidf("Send: %d descriptors in one message: at most %d (MaxFiles)", len(files), MaxFiles)
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			if f == nil {
				return invalidf("Send: file %d of %d is nil", i, len(files))
			}
			fd := f.Fd()
			if fd == ^uintptr(0) {
				return invalidf("Send: file %d of %d (%s) is closed", i, len(files), f.Name())
			}
			fds[i] = int(fd)
		}
		oob = syscall.UnixRights(fds...)
	}
	n, oobn, err := c.c.WriteMsgUnix(payload, oob, nil)
	// The descriptors must stay open until the kernel has duplicated them.
	runtime.KeepAlive(files)
	if err != nil {
		return fmt.Errorf("fdpass: send: %w", err)
	}
	if n != len(payload) || oobn != len(oob) {
		return fmt.Errorf("fdpass: short send: %d of %d bytes, %d of %d control bytes", n, len(payload), oobn, len(oob))
	}
	return nil
}

// Recv receives one message. It returns io.EOF when the peer closed the
// connection. Descriptors beyond maxFiles, or in a message whose payload or
// control data did not fit, are closed and the message is an error: the
// caller never holds a descriptor it did not ask for.
func (c *Conn) Recv(maxFiles int) (payload []byte, files []*os.File, err error) {
	if err := c.check("Recv"); err != nil {
		return nil, nil, err
	}
	if maxFiles < 0 || maxFiles > MaxFiles {
		return nil, nil, invalidf("Recv: maxFiles %d: want 0..%d (MaxFiles)", maxFiles, MaxFiles)
	}
	buf := make([]byte, MaxPayload+1)
	// Room for more than asked, so an oversized message is seen and its
	// descriptors closed rather than silently truncated.
	oob := make([]byte, syscall.CmsgSpace(4*MaxFiles))
	n, oobn, flags, _, err := c.c.ReadMsgUnix(buf, oob)
	if errors.Is(err, io.EOF) {
		return nil, nil, io.EOF
	}
	if err != nil {
		return nil, nil, fmt.Errorf("fdpass: receive: %w", err)
	}
	fds, perr := parseRights(oob[:oobn])
	files = make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "fdpass")
	}
	fail := func(err error) ([]byte, []*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, nil, err
	}
	switch {
	case perr != nil:
		return fail(perr)
	case n == 0 && oobn == 0:
		return nil, nil, io.EOF
	case flags&syscall.MSG_CTRUNC != 0:
		return fail(fmt.Errorf("fdpass: control data truncated: the peer sent more than %d descriptors", MaxFiles))
	case flags&syscall.MSG_TRUNC != 0 || n > MaxPayload:
		return fail(fmt.Errorf("fdpass: message larger than %d bytes", MaxPayload))
	case len(files) > maxFiles:
		return fail(fmt.Errorf("fdpass: message carries %d descriptors, want at most %d", len(files), maxFiles))
	}
	return buf[:n], files, nil
}

// parseRights returns every descriptor in SCM_RIGHTS messages of oob. On a
// malformed message it still returns the descriptors it could parse, so
// the caller can close them.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("fdpass: bad control data: %w", err)
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != syscall.SOL_SOCKET || msgs[i].Header.Type != syscall.SCM_RIGHTS {
			continue
		}
		// The kernel sends whole descriptors; ParseUnixRights indexes
		// past the end of data that is not (a panic), so refuse it here.
		if n := len(msgs[i].Data); n%4 != 0 {
			return fds, fmt.Errorf("fdpass: bad SCM_RIGHTS message: %d bytes of data, not a whole number of 4-byte descriptors", n)
		}
		got, err := syscall.ParseUnixRights(&msgs[i])
		fds = append(fds, got...)
		if err != nil {
			return fds, fmt.Errorf("fdpass: bad SCM_RIGHTS message: %w", err)
		}
	}
	return fds, nil
}
