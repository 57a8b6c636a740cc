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
	ln   *net.UnixListener
	addr string
}

// Listen opens a listener on a fresh abstract socket whose name starts with
// prefix and ends with 16 random hex digits. The name is only a rendezvous
// point: anyone in the network namespace may connect, which is why Accept
// checks the caller's uid.
func Listen(prefix string) (*Listener, error) {
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
	c, err := l.ln.AcceptUnix()
	if err != nil {
		return nil, err
	}
	return checked(c)
}

// Close stops listening; the abstract name is released at once.
// Connections already accepted stay open.
func (l *Listener) Close() error { return l.ln.Close() }

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
// gets a deadline timeout ahead and is handed to handle in its own
// goroutine, and is closed when handle returns. The Server owns l from
// now on: close the Server, not l.
func (l *Listener) Serve(timeout time.Duration, handle func(*Conn)) *Server {
	s := &Server{ln: l, timeout: timeout, handle: handle, conns: map[*Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s
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
// the caller's user. ctx bounds the connect.
func Dial(ctx context.Context, addr string) (*Conn, error) {
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
func (c *Conn) SetDeadline(t time.Time) error { return c.c.SetDeadline(t) }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// Send sends payload (1..MaxPayload bytes) with files' descriptors. The
// receiver gets duplicates; files stay open and owned by the caller.
func (c *Conn) Send(payload []byte, files ...*os.File) error {
	if len(payload) == 0 || len(payload) > MaxPayload {
		return fmt.Errorf("fdpass: payload of %d bytes: want 1..%d", len(payload), MaxPayload)
	}
	if len(files) > MaxFiles {
		return fmt.Errorf("fdpass: %d descriptors in one message: at most %d", len(files), MaxFiles)
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
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
	if maxFiles < 0 || maxFiles > MaxFiles {
		return nil, nil, fmt.Errorf("fdpass: maxFiles %d: want 0..%d", maxFiles, MaxFiles)
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
