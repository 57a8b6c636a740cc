//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/collgen/collgen/runtime/fdpass"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// DefaultChannels is the number of signal channels per pad when
// Config.Channels is 0.
const DefaultChannels = 64

// MaxChannels bounds Config.Channels (a pad holds Channels × WorldSize
// words of 4 bytes).
const MaxChannels = 4096

// MaxWorldSize bounds Config.WorldSize: a pool's ranks live on one host
// (their memory is mapped across processes), and each rank keeps a
// socket, an entry and a mapping per peer.
const MaxWorldSize = 4096

// testHook, set only by tests, runs at named points of a Rendezvous so
// that a test can kill a rank exactly there.
var testHook func(rank int, point string)

// DefaultTimeout bounds collective calls whose ctx has no deadline and
// signal operations given no timeout, when Config.Timeout is 0.
const DefaultTimeout = 5 * time.Minute

// Config describes one rank of a pool.
type Config struct {
	// Group names the group: store keys live under "collgen/symm/<Group>/".
	// Ranks with different group names never meet (a rank started with
	// the wrong name shows up as missing on the others).
	Group string
	// Rank is this rank, 0 ≤ Rank < WorldSize.
	Rank int
	// WorldSize is the number of ranks; all must agree.
	WorldSize int
	// Device is the GPU ordinal of this rank, for errors and tools; the
	// CUDA backend uses the device it was made for (NewCUDABackend), and
	// the host twin ignores it.
	Device int
	// Store is the rendezvous store shared by the ranks. The pool does not
	// close it.
	Store rendezvous.Store
	// Backend makes the memory; nil means NewHostBackend(). All ranks must
	// use the same kind.
	Backend Backend
	// Channels is the number of signal channels per pad (DefaultChannels
	// when 0); all ranks must agree.
	Channels int
	// Timeout bounds collective calls whose ctx has no deadline and signal
	// operations given a zero timeout (DefaultTimeout when 0).
	Timeout time.Duration
}

// Pool is one rank's view of a group's symmetric memory: it allocates
// local buffers, runs the collective Rendezvous that maps every rank's
// buffer into every rank, and serves this rank's memory descriptors to
// peers over an fdpass socket.
//
// Alloc, AllocPersistent, Free and Lookup are local and safe for
// concurrent use. Rendezvous is collective: every rank must call it on
// corresponding buffers in the same order (the n-th Rendezvous of each
// rank meets the n-th of every other); the pool runs one at a time.
type Pool struct {
	cfg   Config
	be    Backend
	gran  int
	pad   int    // signal pad bytes per chunk
	nonce string // rank 0's random id of this pool instance
	ns    string // store prefix of this pool instance
	socks []string

	// rdvSem (one slot) serialises Rendezvous calls, so the order they
	// meet in is the order they were made in, and a call waiting for it
	// still ends with its ctx (Free, Close); rdvCount, guarded by it,
	// numbers them for errors.
	rdvSem   chan struct{}
	rdvCount int

	mu     sync.Mutex
	closed bool
	broken error // the Rendezvous failure that broke the pool (ErrBroken)
	// rdvs counts the Rendezvous calls past their start (Add under the
	// buffer's mu, before Close can free it), so Close returns only once
	// the ones it cancelled have let go of everything.
	rdvs    sync.WaitGroup
	live    map[*Buffer]struct{}
	persist map[uint64]*slot

	// The descriptor server (answer), started once the pool is formed;
	// srvMu guards exports (descriptors offered during a Rendezvous, by
	// sequence number).
	srv     *fdpass.Server
	srvMu   sync.Mutex
	exports map[uint64]*os.File
	nextSeq uint64
}

// slot is a persistent id's address reservation. It outlives the buffers
// allocated under the id and is released by Close, with what its first
// Rendezvous made for every later one: a reservation per peer (peers[r],
// 0 at this rank), where each Rendezvous maps that peer's chunk, and the
// device pointer arrays, whose contents (every rank's address) never
// change. So every address a kernel captured in a CUDA graph reads stays
// valid across Free, AllocPersistent and Rendezvous. Guarded by Pool.mu.
type slot struct {
	addr  uintptr
	bytes int
	chunk int
	buf   *Buffer // the live buffer, nil while the id is free

	peers            []uintptr
	ptrsDev, padsDev uintptr
	freeDev          []func() error
}

// release returns the slot's reservations and device arrays (Close).
func (s *slot) release(be Backend) []error {
	errs := []error{be.Release(s.addr, s.chunk)}
	for _, a := range s.peers {
		if a != 0 {
			errs = append(errs, be.Release(a, s.chunk))
		}
	}
	for _, free := range s.freeDev {
		errs = append(errs, free())
	}
	return errs
}

// poolInfo is what each rank publishes when a pool forms.
type poolInfo struct {
	World    int
	Channels int
	Backend  string
	Sock     string
	Nonce    string
}

// NewPool forms this rank's pool. It is collective: it returns once every
// rank of the group has called it with the same world size, channel count
// and backend kind, or fails on every rank that can see a disagreement,
// with an error (wrapping ErrMismatch) naming both values. A rank that
// never comes makes the others fail at ctx's deadline (or Config.Timeout)
// with an error wrapping ErrTimeout that names it.
func NewPool(ctx context.Context, cfg Config) (*Pool, error) {
	switch {
	case cfg.Store == nil:
		return nil, invalidf("symm: Config.Store is nil: ranks need a rendezvous store")
	case cfg.Group == "":
		return nil, invalidf("symm: Config.Group is empty: name the group")
	case cfg.WorldSize < 1 || cfg.WorldSize > MaxWorldSize:
		return nil, invalidf("symm: world size %d: want 1 to %d (MaxWorldSize)", cfg.WorldSize, MaxWorldSize)
	case cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize:
		return nil, invalidf("symm: rank %d is out of range for world size %d", cfg.Rank, cfg.WorldSize)
	case cfg.Channels < 0 || cfg.Channels > MaxChannels:
		return nil, invalidf("symm: %d signal channels: want 0 (default %d) to %d", cfg.Channels, DefaultChannels, MaxChannels)
	case cfg.Timeout < 0:
		return nil, invalidf("symm: negative timeout %v: want 0 (default %v) or more", cfg.Timeout, DefaultTimeout)
	}
	if cfg.Channels == 0 {
		cfg.Channels = DefaultChannels
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Backend == nil {
		cfg.Backend = NewHostBackend()
	}
	if g := cfg.Backend.Granularity(); g <= 0 {
		return nil, invalidf("symm: the %q backend reports a granularity of %d bytes: a Backend's Granularity must be positive", cfg.Backend.Kind(), g)
	}
	p := &Pool{cfg: cfg, be: cfg.Backend, gran: cfg.Backend.Granularity(), pad: 4 * cfg.Channels * cfg.WorldSize,
		live: map[*Buffer]struct{}{}, persist: map[uint64]*slot{}, exports: map[uint64]*os.File{}, rdvSem: make(chan struct{}, 1)}
	ctx, cancel := p.bound(ctx)
	defer cancel()

	ln, err := fdpass.Listen("collgen-symm-")
	if err != nil {
		return nil, err
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		ln.Close()
		return nil, err
	}
	// The group is the namespace below, so ranks with different group
	// names cannot meet there; this store-wide note lets a timeout say
	// which group a missing rank went to instead.
	seen := seenNote{Group: cfg.Group, World: cfg.WorldSize}
	if err := cfg.Store.Set(ctx, seenKey(cfg.Rank), mustJSON(seen)); err != nil {
		ln.Close()
		return nil, fmt.Errorf("symm: rank %d forming group %q: %w", cfg.Rank, cfg.Group, err)
	}
	mine := poolInfo{World: cfg.WorldSize, Channels: cfg.Channels, Backend: p.be.Kind(), Sock: ln.Addr(), Nonce: hex.EncodeToString(rnd[:])}
	infos := make([]poolInfo, cfg.WorldSize)
	formPrefix := "collgen/symm/" + cfg.Group + "/pool/"
	entries, gen, err := exchange(ctx, cfg.Store, formPrefix, cfg.Rank, cfg.WorldSize, mustJSON(mine), func(r int, b []byte) error {
		var in poolInfo
		if err := json.Unmarshal(b, &in); err != nil {
			return fmt.Errorf("symm: group %q: rank %d's pool entry: %w", cfg.Group, r, err)
		}
		if err := agree(cfg, r, "world size", in.World, mine.World); err != nil {
			return err
		}
		if err := agree(cfg, r, "signal channel count", in.Channels, mine.Channels); err != nil {
			return err
		}
		if in.Backend != mine.Backend {
			return mismatchf("rank %d uses the %q backend but rank %d (this rank) uses %q", r, in.Backend, cfg.Rank, mine.Backend)
		}
		infos[r] = in
		return nil
	})
	if err == nil {
		if err = sameEntries(ctx, cfg, infos[0].Nonce, entries); err != nil {
			retract(ctx, cfg.Store, formPrefix, cfg.Rank, gen)
		}
	}
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("symm: rank %d forming group %q: %w", cfg.Rank, cfg.Group, otherGroups(ctx, cfg, err))
	}
	p.nonce = infos[0].Nonce
	p.ns = "collgen/symm/" + cfg.Group + "/" + p.nonce + "/"
	p.socks = make([]string, cfg.WorldSize)
	for r, in := range infos {
		p.socks[r] = in.Sock
	}
	if p.srv, err = ln.Serve(cfg.Timeout, p.answer); err != nil {
		ln.Close()
		return nil, fmt.Errorf("symm: rank %d: serve memory descriptors: %w", cfg.Rank, err)
	}
	return p, nil
}

// sameEntries is NewPool's second round: every rank publishes a digest of
// the entries it formed the pool from, under rank 0's nonce, and all must
// match. An entry left by an earlier NewPool of the group that a rank gave
// up on, read at the moment it was withdrawn (see exchange), would
// otherwise give a pool whose peer is gone; here it fails every rank that
// can see it, wrapping ErrMismatch.
func sameEntries(ctx context.Context, cfg Config, nonce0 string, entries [][]byte) error {
	h := sha256.New()
	for _, e := range entries {
		fmt.Fprintf(h, "%d:", len(e))
		h.Write(e)
	}
	mine := hex.EncodeToString(h.Sum(nil))
	_, _, err := exchange(ctx, cfg.Store, "collgen/symm/"+cfg.Group+"/formed/"+nonce0+"/", cfg.Rank, cfg.WorldSize, []byte(mine), func(r int, b []byte) error {
		if string(b) != mine {
			return mismatchf("rank %d formed group %q from other entries than rank %d (this rank) did: one was left by an earlier NewPool of the group on this store that gave up; call NewPool again on every rank", r, cfg.Group, cfg.Rank)
		}
		return nil
	})
	return err
}

// usable returns ErrClosed for a closed pool and an ErrBroken error for a
// broken one.
func (p *Pool) usable() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return ErrClosed
	case p.broken != nil:
		return &tagged{msg: fmt.Sprintf("symm: group %q rank %d: pool broken by an earlier failure (%v); close it and form a new one", p.cfg.Group, p.cfg.Rank, p.broken), is: []error{ErrBroken}}
	}
	return nil
}

// breakWith marks the pool broken by err, the first such failure.
func (p *Pool) breakWith(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken == nil {
		p.broken = err
	}
}

// procID tells this process apart from every other (a random id made at
// start-up: process ids are reused, and containers share them). Ranks of
// one process map each other's chunks through LocalSharer when the backend
// offers it.
var procID = func() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}()

// seenNote is what NewPool records under seenKey(rank): the group this
// rank number of the store last started to form.
type seenNote struct {
	Group string
	World int
}

// seenKey is store-wide, outside every group's namespace.
func seenKey(rank int) string { return "collgen/symm/seen/r" + strconv.Itoa(rank) }

// otherGroups adds to a NewPool timeout the group names that missing ranks
// last started to form, when those differ from ours. A rank number can be
// in several groups of one store (two tensor-parallel groups each have a
// rank 1), so this is a hint next to the timeout: the error still wraps
// ErrTimeout only.
func otherGroups(ctx context.Context, cfg Config, err error) error {
	var mre *rendezvous.MissingRanksError
	if !errors.As(err, &mre) {
		return err
	}
	base := context.WithoutCancel(ctx)
	cw, cancelW := context.WithTimeout(base, 100*time.Millisecond)
	defer cancelW()
	keys := make([]string, len(mre.Missing))
	for i, r := range mre.Missing {
		keys[i] = seenKey(r)
	}
	absent := map[string]bool{}
	var we *rendezvous.WaitError
	if werr := cfg.Store.Wait(cw, keys...); errors.As(werr, &we) {
		for _, k := range we.Missing {
			absent[k] = true
		}
	}
	cg, cancel := context.WithTimeout(base, time.Second)
	defer cancel()
	var notes []string
	for i, r := range mre.Missing {
		if absent[keys[i]] {
			continue
		}
		b, gerr := cfg.Store.Get(cg, keys[i])
		var n seenNote
		if gerr != nil || json.Unmarshal(b, &n) != nil || n.Group == cfg.Group {
			continue
		}
		notes = append(notes, fmt.Sprintf("rank %d last started group %q (world size %d), not %q", r, n.Group, n.World, cfg.Group))
	}
	if len(notes) == 0 {
		return err
	}
	return &tagged{msg: err.Error() + "; " + strings.Join(notes, "; ") + ": if that is a rank of this group, start every rank with the same group name", is: []error{err}}
}

// agree returns an ErrMismatch error naming both ranks and values unless
// theirs equals ours.
func agree(cfg Config, r int, what string, theirs, ours int) error {
	if theirs == ours {
		return nil
	}
	return mismatchf("rank %d has %s %d but rank %d (this rank) has %s %d; start every rank with the same value",
		r, what, theirs, cfg.Rank, what, ours)
}

// mustJSON encodes v, a plain struct of ints and strings.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain structs of ints and strings always encode
	}
	return b
}

// bound gives ctx the pool's default deadline if it has none.
func (p *Pool) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, p.cfg.Timeout)
}

// Rank is this pool's rank.
func (p *Pool) Rank() int { return p.cfg.Rank }

// WorldSize is the number of ranks in the group.
func (p *Pool) WorldSize() int { return p.cfg.WorldSize }

// Group is the group's name.
func (p *Pool) Group() string { return p.cfg.Group }

// ID names this instance of the group: a random id rank 0 drew when the
// pool formed, the same on every rank of it and different for every other
// pool, even one of the same group name formed later. Ranks compare IDs to
// prove they hold the same pool (comm does before reading peers' buffers).
func (p *Pool) ID() string { return p.nonce }

// Backend is the memory backend the pool uses.
func (p *Pool) Backend() Backend { return p.be }

// layout returns where the signal pad starts in a chunk for a buffer of
// n bytes, and the chunk's size: [buffer, padded to 64 bytes][pad], rounded
// up to the backend's granularity.
func (p *Pool) layout(n int) (padOff, chunk int) {
	padOff = (n + 63) &^ 63
	chunk = (padOff + p.pad + p.gran - 1) / p.gran * p.gran
	return padOff, chunk
}

// Alloc allocates a buffer of n bytes backed by new zeroed memory, with a
// zeroed signal pad after it. It is local: no other rank takes part until
// Rendezvous.
func (p *Pool) Alloc(n int) (*Buffer, error) { return p.alloc(n, 0, false) }

// AllocPersistent allocates like Alloc, at an address that is the same
// for every allocation under id: the first one reserves an address range
// that the pool keeps until Close, and later ones (after Free) map new
// memory at the same address. Each Rendezvous of the id's buffers maps
// every peer's chunk at the same address as the first did, and hands the
// same device pointer arrays, so every pointer a kernel captured in a CUDA
// graph uses (this rank's, its peers', BufferPtrsDev, SignalPadPtrsDev)
// stays valid (a peer's address here is this rank's reservation, however
// that peer allocated its buffer). It fails (ErrInvalidArgument) if
// the id's buffer is still live, or if n differs from the id's first size
// (naming both).
func (p *Pool) AllocPersistent(n int, id uint64) (*Buffer, error) { return p.alloc(n, id, true) }

// MaxAllocBytes is the largest buffer Alloc and AllocPersistent take
// (256 TiB, past any GPU's memory), so a buffer's chunk, padded and with
// its signal pad, cannot overflow.
const MaxAllocBytes = 1 << 48

// alloc is Alloc and AllocPersistent.
func (p *Pool) alloc(n int, id uint64, persistent bool) (*Buffer, error) {
	if n <= 0 || n > MaxAllocBytes {
		return nil, invalidf("symm: allocation of %d bytes: want a positive size of at most %d (MaxAllocBytes)", n, MaxAllocBytes)
	}
	padOff, chunk := p.layout(n)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	var s *slot
	var addr uintptr
	if persistent {
		if s = p.persist[id]; s != nil {
			if s.buf != nil {
				return nil, invalidf("symm: persistent id %d is in use (%d bytes at %#x); free that buffer first", id, s.bytes, s.addr)
			}
			if s.bytes != n {
				return nil, invalidf("symm: persistent id %d was allocated with %d bytes, now with %d: an id keeps its first size", id, s.bytes, n)
			}
			addr = s.addr
		}
	}
	if addr == 0 {
		a, err := p.be.Reserve(chunk)
		if err != nil {
			return nil, err
		}
		addr = a
	}
	c, err := p.be.Create(addr, chunk)
	if err != nil {
		if s == nil {
			p.be.Release(addr, chunk)
		}
		return nil, err
	}
	b := &Buffer{pool: p, addr: addr, size: n, chunkSize: chunk, padOff: padOff, id: id, persistent: persistent, chunk: c, rdv: make(chan struct{}, 1)}
	if persistent {
		if s == nil {
			s = &slot{addr: addr, bytes: n, chunk: chunk}
			p.persist[id] = s
		}
		s.buf = b
	}
	p.live[b] = struct{}{}
	register(b)
	return b, nil
}

// Forget deletes the group's keys from the store: the pool's forming
// exchanges and every Rendezvous's, under "collgen/symm/<Group>/" (the
// store-wide note of the group each rank number last formed, one key per
// rank number, stays). Call it on one rank once every rank has closed its
// pool and no rank is forming a pool of the same group name: a rank still
// exchanging would wait until its deadline, and a new pool of the name
// would meet the old one's counters reset. ForgetGroup does the same
// from the store alone, for a rank without the pool. Best effort: the
// first store error is returned after every key was tried. It works on a
// closed pool.
func (p *Pool) Forget(ctx context.Context) error {
	return forgetPools(ctx, p.cfg.Store, p.cfg.Group, p.cfg.WorldSize, p.nonce)
}

// ForgetGroup is Forget for the pools of group (Config.Group) of world
// ranks, from the store alone: a rank whose NewPool failed, or that never
// called it, can forget the pools its peers formed, and the forming
// exchange's counters a failed NewPool leaves. It finds the pools by
// rank 0's last two forming entries (a group formed more often than
// that, on one store, keeps the earlier pools' Rendezvous keys).
// comm's last rank to leave a group does, for the pool behind Alloc (its
// group name is unique to the formation), whoever formed it. The same
// conditions as Forget hold. A nil store, an empty group or a world size
// NewPool refuses is an error wrapping ErrInvalidArgument.
func ForgetGroup(ctx context.Context, st rendezvous.Store, group string, world int) error {
	switch {
	case st == nil:
		return invalidf("symm: ForgetGroup: the store is nil")
	case group == "":
		return invalidf("symm: ForgetGroup: the group name is empty; pass the pools' Config.Group")
	case world < 1 || world > MaxWorldSize:
		return invalidf("symm: ForgetGroup: world size %d: want 1 to %d (MaxWorldSize)", world, MaxWorldSize)
	}
	form := "collgen/symm/" + group + "/pool/"
	g0, err := st.Add(ctx, form+"gen/r0", 0) // creates a missing counter, deleted below
	if err != nil {
		return errors.Join(err, forgetPools(ctx, st, group, world))
	}
	var nonces []string
	for _, g := range []int64{g0 - 1, g0} {
		if g < 1 {
			continue
		}
		// Read without waiting: a swap means the entry was gone (now
		// empty, and deleted with the exchange's keys).
		cur, absent, err := st.CompareAndSet(ctx, form+strconv.FormatInt(g, 10)+"/r0", nil, []byte{})
		var in poolInfo
		if err == nil && !absent && json.Unmarshal(cur, &in) == nil && in.Nonce != "" {
			nonces = append(nonces, in.Nonce)
		}
	}
	return forgetPools(ctx, st, group, world, nonces...)
}

// forgetPools deletes the forming exchange of group and, for each pool
// nonce, its digest round and its Rendezvous's exchanges.
func forgetPools(ctx context.Context, st rendezvous.Store, group string, world int, nonces ...string) error {
	prefixes := []string{"collgen/symm/" + group + "/pool/"}
	for _, n := range nonces {
		ns := "collgen/symm/" + group + "/" + n + "/"
		prefixes = append(prefixes, "collgen/symm/"+group+"/formed/"+n+"/", ns+"rdv/", ns+"mapped/")
	}
	return forgetExchanges(ctx, st, world, prefixes...)
}

// Close frees every live buffer (as Free), releases the persistent
// reservations, stops serving descriptors and closes the socket. It is
// local and does not wait for peers: memory they still map lives on until
// they free it, and a Rendezvous of this rank still waiting for them ends
// at once with ErrClosed (Close returns once it has let go). A second
// Close does nothing.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var bufs []*Buffer
	for b := range p.live {
		bufs = append(bufs, b)
	}
	p.mu.Unlock()
	var errs []error
	for _, b := range bufs {
		if err := b.free(true); err != nil && !errors.Is(err, ErrFreed) {
			errs = append(errs, err)
		}
	}
	p.rdvs.Wait()
	p.mu.Lock()
	for id, s := range p.persist {
		errs = append(errs, s.release(p.be)...)
		delete(p.persist, id)
	}
	p.mu.Unlock()

	errs = append(errs, p.srv.Close())
	return errors.Join(errs...)
}

// fdRequest asks a peer's server for the descriptor it offers under Seq.
type fdRequest struct {
	Nonce string
	Seq   uint64
	Rank  int
}

// fdReply answers an fdRequest; the descriptor rides along unless Err is
// set.
type fdReply struct{ Err string }

// answer answers one request on c (the Server bounds it by the pool's
// timeout and closes c).
func (p *Pool) answer(c *fdpass.Conn) {
	b, _, err := c.Recv(0)
	if err != nil {
		return
	}
	var req fdRequest
	if err := json.Unmarshal(b, &req); err != nil {
		c.Send(mustJSON(fdReply{Err: "bad request: " + err.Error()}))
		return
	}
	if req.Nonce != p.nonce {
		c.Send(mustJSON(fdReply{Err: fmt.Sprintf("request for pool %q reached rank %d of another pool instance", req.Nonce, p.cfg.Rank)}))
		return
	}
	// Held while sending so Rendezvous cannot close the descriptor
	// under us; the send is one datagram on a local socket.
	p.srvMu.Lock()
	defer p.srvMu.Unlock()
	f := p.exports[req.Seq]
	if f == nil {
		c.Send(mustJSON(fdReply{Err: fmt.Sprintf("rank %d offers nothing under sequence %d to rank %d (its rendezvous ended: timed out or failed)", p.cfg.Rank, req.Seq, req.Rank)}))
		return
	}
	c.Send(mustJSON(fdReply{}), f)
}

// offer makes f available to peers until withdraw(seq), which closes it,
// and returns seq.
func (p *Pool) offer(f *os.File) uint64 {
	p.srvMu.Lock()
	defer p.srvMu.Unlock()
	p.nextSeq++
	p.exports[p.nextSeq] = f
	return p.nextSeq
}

// withdraw stops offering seq's descriptor and closes it.
func (p *Pool) withdraw(seq uint64) {
	p.srvMu.Lock()
	f := p.exports[seq]
	delete(p.exports, seq)
	p.srvMu.Unlock()
	f.Close()
}

// pull fetches peer's descriptor offered under seq and maps it (at at,
// when not 0: see Backend.Import).
func (p *Pool) pull(ctx context.Context, peer int, seq uint64, size int, at uintptr) (Mapping, error) {
	c, err := fdpass.Dial(ctx, p.socks[peer])
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	// The socket knows only the deadline: a cancelled ctx (the caller's,
	// or Free and Close ending the Rendezvous) ends a wait for a peer
	// that took the request and never answers (a stopped process).
	defer context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })()
	if err := c.Send(mustJSON(fdRequest{Nonce: p.nonce, Seq: seq, Rank: p.cfg.Rank})); err != nil {
		return nil, err
	}
	b, files, err := c.Recv(1)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var rep fdReply
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("bad reply: %w", err)
	}
	if rep.Err != "" {
		return nil, errors.New(rep.Err)
	}
	if len(files) != 1 {
		return nil, fmt.Errorf("reply carries %d descriptors, want 1", len(files))
	}
	return p.be.Import(files[0], size, at)
}
