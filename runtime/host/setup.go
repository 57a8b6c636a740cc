package host

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/collgen/collgen/internal/meminfo"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/shm"
)

// testHook, when set (by tests only), is called at named points of set-up
// and execution so a test can kill or stall a rank exactly there.
var testHook func(rank int, point string)

func (g *Group) hook(point string) {
	if testHook != nil {
		testHook(g.cfg.Rank, point)
	}
}

// SegmentName returns the name of a rank's segment for a group and nonce:
// collgen-<sha256(group, world)[:8 bytes]>-<nonce>-r<rank>. Under a
// launcher the nonce starts with the run id (shm.RunNonce), so the launcher
// can sweep every segment of the run once its ranks have exited.
func SegmentName(group string, world int, nonce string, rank int) string {
	return fmt.Sprintf("%s%s-%s-r%d", shm.Prefix, GroupHash(group, world), nonce, rank)
}

// GroupHash is the group part of segment names: 16 hex digits of
// sha256(group name, world size). Tests scan /dev/shm for it.
func GroupHash(group string, world int) string {
	h := sha256.Sum256([]byte(group + "\x00" + strconv.Itoa(world)))
	return hex.EncodeToString(h[:8])
}

// ensureSetup runs set-up once; goroutines arriving together wait for the
// first, and all see its result. A failed set-up breaks the group.
func (g *Group) ensureSetup(ctx context.Context) error {
	if g.ready.Load() {
		return nil
	}
	select {
	case g.setupSem <- struct{}{}:
	default:
		// Another call of this rank is setting up: wait for it, but only
		// as long as this call's context allows (the set-up goes on).
		select {
		case g.setupSem <- struct{}{}:
		case <-ctx.Done():
			err := fmt.Errorf("host: rank %d: waiting for the set-up of group %q that another call began: %w", g.cfg.Rank, g.cfg.Group, ctx.Err())
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				err = fmt.Errorf("%w: %w", ErrTimeout, err)
			}
			return err
		}
	}
	defer func() { <-g.setupSem }()
	if g.ready.Load() {
		return nil
	}
	if err := g.brokenErr(); err != nil {
		return err
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	g.cancelMu.Lock()
	if g.closed.Load() { // checked under cancelMu: Close cancels after setting it
		g.cancelMu.Unlock()
		return ErrClosed
	}
	g.cancelSetup = cancel
	g.cancelMu.Unlock()
	err := g.setup(sctx)
	g.cancelMu.Lock()
	g.cancelSetup = nil
	g.cancelMu.Unlock()
	if err != nil {
		if errors.Is(context.Cause(sctx), ErrClosed) {
			err = fmt.Errorf("%w: set-up ended by Close: %w", ErrClosed, err)
		} else if !errors.Is(err, ErrTimeout) {
			// A store call (the nonce, a mark) that ran into the
			// deadline, its server gone say: a timeout as waitKeys'
			// are, which marks nothing (the store may not answer).
			err = wrapStoreErr(err)
		}
		err = fmt.Errorf("host: rank %d set-up of group %q: %w", g.cfg.Rank, g.cfg.Group, err)
		g.fail(err)
		if errors.Is(err, ErrClosed) || !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrPeerFailed) {
			// This rank's own step failed, or Close ended it: peers still
			// in set-up fail now, naming it, not at their deadline. (A
			// rank that waited for, or lost, a peer marks nothing: the
			// peers see that peer themselves.)
			g.markLeft()
		}
		return err
	}
	g.ready.Store(true)
	return nil
}

// leftPoll is how often a rank waiting in set-up looks whether a peer
// closed before finishing its own (markLeft).
const leftPoll = 20 * time.Millisecond

// markLeft tells ranks in set-up that this rank left before finishing its
// own (its set-up failed, or Close came first): left/r<rank>, then the left
// counter they poll (waitKeys). Best effort, within a second: a store that
// fails now leaves peers to time out. Idempotent for peers (they count
// ranks, not marks).
func (g *Group) markLeft() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if g.cfg.Store.Set(ctx, g.prefix+"left/r"+strconv.Itoa(g.cfg.Rank), []byte{1}) == nil {
		g.cfg.Store.Add(ctx, g.prefix+"left", 1)
	}
}

// waitKeys waits until every key exists, like Store.Wait, but fails at
// once with ErrPeerFailed when a rank left the group before finishing its
// set-up (markLeft), naming it. On the deadline the error is the
// store's (naming the missing keys), wrapped by wrapStoreErr.
func (g *Group) waitKeys(ctx context.Context, keys ...string) error {
	st := g.cfg.Store
	for {
		wctx, cancel := context.WithTimeout(ctx, leftPoll)
		err := st.Wait(wctx, keys...)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || !errors.Is(err, rendezvous.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return wrapStoreErr(err)
		}
		if n, aerr := st.Add(ctx, g.prefix+"left", 0); aerr == nil && n > 0 {
			return g.leftError(ctx)
		}
	}
}

// leftError names the ranks that left before finishing set-up.
func (g *Group) leftError(ctx context.Context) error {
	var left []int
	cw, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	var we *rendezvous.WaitError
	keys := g.rankKeys("left/")
	if err := g.cfg.Store.Wait(cw, keys...); errors.As(err, &we) {
		for r, k := range keys {
			if !slices.Contains(we.Missing, k) {
				left = append(left, r)
			}
		}
	} else if err == nil {
		for r := range keys {
			left = append(left, r)
		}
	}
	return fmt.Errorf("%w: ranks %v left the group before finishing set-up (their set-up failed, or they closed it)", ErrPeerFailed, left)
}

// Forget deletes the store keys of a group's set-up (nonce, layout, and
// the created, mapped and left marks) once every rank of it has closed:
// only set-up reads them, and a process that forms and closes groups on
// one long-lived store would otherwise keep them all. group and world are
// the group's Config.Group and WorldSize; a nil store, an empty group or
// a world size New refuses is an error wrapping ErrInvalidArgument. The
// keys go rendezvous.KeysInFlight at a time (rendezvous.DeleteKeys): the
// error names the first key not deleted; keys already gone are no error.
func Forget(ctx context.Context, st rendezvous.Store, group string, world int) error {
	switch {
	case st == nil:
		return invalidConfigf("host: Forget: the store is nil")
	case group == "":
		return invalidConfigf("host: Forget: the group name is empty; pass the group's Config.Group")
	case world < 1 || world > 64:
		return invalidConfigf("host: Forget: world size %d out of range 1..64; pass the group's Config.WorldSize", world)
	}
	prefix := keyPrefix(group)
	keys := []string{prefix + "nonce", prefix + "layout", prefix + "left"}
	for r := 0; r < world; r++ {
		rk := strconv.Itoa(r)
		keys = append(keys, prefix+"created/r"+rk, prefix+"mapped/r"+rk, prefix+"left/r"+rk)
	}
	return rendezvous.DeleteKeys(ctx, st, keys...)
}

// keyPrefix is where a group's store keys live.
func keyPrefix(group string) string { return "collgen/host/" + group + "/" }

// setup agrees on a nonce and layout through the store, creates this
// rank's segment, maps every peer's, and unlinks all names once every rank
// has mapped every segment. Store keys (under g.prefix):
//
//	nonce        random hex, set by the first rank to get there (CAS)
//	layout       rank 0's layout
//	created/r<i> rank i created and initialised its segment
//	mapped/r<i>  rank i mapped every segment
//
// Who unlinks: after the mapped barrier every rank unlinks every name
// (ENOENT is fine), so names vanish even if some rank dies right after the
// barrier. On failure before that, the failing rank unlinks every name of
// the group too, so a rank killed during set-up leaves nothing behind as
// long as one rank survives to time out.
func (g *Group) setup(ctx context.Context) error {
	ctx, cancel := g.waitCtx(ctx)
	defer cancel()
	st, w, rank := g.cfg.Store, g.cfg.WorldSize, g.cfg.Rank
	g.hook("setup:start")

	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return err
	}
	// The run id (COLLGEN_RUN_ID, set by collgen run) tags the names so
	// the launcher can remove a killed rank's segment; an invalid one is
	// refused by rendezvous.ReadEnv and ignored here.
	runID := os.Getenv(rendezvous.EnvRunID)
	if rendezvous.CheckRunID(runID) != nil {
		runID = ""
	}
	cur, _, err := st.CompareAndSet(ctx, g.prefix+"nonce", nil, []byte(shm.RunNonce(runID, hex.EncodeToString(rnd[:]))))
	if err != nil {
		return fmt.Errorf("agree on a segment nonce: %w", err)
	}
	nonce := string(cur)
	if shm.CheckName(shm.Prefix+nonce) != nil || len(nonce) == 0 || len(nonce) > 40 {
		return fmt.Errorf("bad nonce %q in store key %snonce", nonce, g.prefix)
	}

	lay := g.defaultLayout()
	if rank == 0 {
		if err := st.Set(ctx, g.prefix+"layout", lay.encode()); err != nil {
			return fmt.Errorf("publish layout: %w", err)
		}
	} else {
		if err := g.waitKeys(ctx, g.prefix+"layout"); err != nil {
			return fmt.Errorf("read rank 0's layout: %w", err)
		}
		b, err := st.Get(ctx, g.prefix+"layout")
		if err != nil {
			return fmt.Errorf("read rank 0's layout: %w", wrapStoreErr(err))
		}
		l0, err := decodeLayout(b)
		if err != nil {
			return err
		}
		if (g.cfg.Slots != 0 && g.cfg.Slots != l0.Slots) || (g.cfg.Lanes != 0 && g.cfg.Lanes != l0.Lanes) ||
			(g.cfg.SlotBytes != 0 && laneBytes(g.cfg.SlotBytes, l0.Lanes, w) != l0.LaneBytes) {
			return fmt.Errorf("layout differs from rank 0's (slots %d, lanes %d, lane bytes %d here; %d, %d, %d there): pass the same Slots, Lanes and SlotBytes on every rank",
				lay.Slots, lay.Lanes, lay.LaneBytes, l0.Slots, l0.Lanes, l0.LaneBytes)
		}
		lay = l0
	}
	if lay.Slots < 1 || lay.Slots > 64 || lay.Lanes < 1 || lay.Lanes > MaxLanes || lay.LaneBytes < 2*w*64 || lay.LaneBytes%pageBytes != 0 {
		return fmt.Errorf("bad layout %+v for world %d", lay, w)
	}
	g.lay = lay
	g.names = make([]string, w)
	for r := range g.names {
		g.names[r] = SegmentName(g.cfg.Group, w, nonce, r)
	}
	g.pidNS = shm.PIDNamespace()

	ok := false
	defer func() {
		if ok {
			return
		}
		// Failed set-up: remove our name and any a dead peer left, and
		// unmap what we mapped. Peers that mapped our segment may have
		// finished their set-up (we failed after publishing our mapped
		// mark) and wait for us in a collective: our abort word, set
		// before we let go of the segment, ends those waits at once
		// (fail, later, finds no segment to set it in).
		if g.self != nil {
			atomic.StoreUint64(hdr(g.self.Bytes(), hdrAbort), 1)
		}
		g.unlinkVerified()
		for i, s := range g.peers {
			if s != nil {
				s.Close()
				g.peers[i] = nil
			}
		}
		g.self, g.mems = nil, nil
	}()

	g.hook("setup:create")
	// A segment is memory taken now (fallocate on /dev/shm) or a Go
	// allocation (goroutine ranks), which Go cannot fail softly: one
	// larger than the process has left ends it ("fatal error: out of
	// memory"). Refuse what is plainly beyond that (a snapshot, as in
	// symm's host twin).
	if avail, ok := meminfo.Available(); ok && int64(lay.size()) > avail {
		return fmt.Errorf("%w: this rank's segment needs %d bytes (%d slots x %d lanes x %d bytes) and the process has %d left (MemAvailable and its memory cgroup): pass a smaller Config.SlotBytes or Config.Slots",
			ErrSharedMemory, lay.size(), lay.Slots, lay.Lanes, lay.LaneBytes, avail)
	}
	self, err := g.prov.Create(g.names[rank], lay.size())
	if err != nil {
		return fmt.Errorf("%w: create this rank's segment: %w", ErrSharedMemory, err)
	}
	g.self = self
	g.peers = make([]shm.Segment, w)
	g.peers[rank] = self
	mem := self.Bytes()
	// Header words are written before the created key is published; peers
	// read them only after seeing that key (the store orders the two).
	for i, v := range map[int]uint64{hdrWorld: uint64(w), hdrRank: uint64(rank), hdrPID: uint64(os.Getpid()),
		hdrPIDNS: g.pidNS, hdrSlots: uint64(lay.Slots), hdrLanes: uint64(lay.Lanes), hdrLaneLen: uint64(lay.LaneBytes)} {
		atomic.StoreUint64(hdr(mem, i), v)
	}
	atomic.StoreUint64(hdr(mem, hdrMagic), magic)
	g.hook("setup:created")
	if err := st.Set(ctx, g.prefix+"created/r"+strconv.Itoa(rank), []byte(nonce)); err != nil {
		return fmt.Errorf("publish segment: %w", err)
	}
	if err := g.waitKeys(ctx, g.rankKeys("created/")...); err != nil {
		return fmt.Errorf("wait for every rank to create its segment: %w", err)
	}
	for r := 0; r < w; r++ {
		if r == rank {
			continue
		}
		s, err := g.prov.Open(g.names[r], lay.size())
		if err != nil {
			// It published its segment: gone or changed since, it left.
			return fmt.Errorf("%w: map rank %d's segment: %w", ErrPeerFailed, r, err)
		}
		g.peers[r] = s
		pm := s.Bytes()
		if loadHdr(pm, hdrMagic) != magic || loadHdr(pm, hdrWorld) != uint64(w) || loadHdr(pm, hdrRank) != uint64(r) ||
			loadHdr(pm, hdrSlots) != uint64(lay.Slots) || loadHdr(pm, hdrLanes) != uint64(lay.Lanes) || loadHdr(pm, hdrLaneLen) != uint64(lay.LaneBytes) {
			return fmt.Errorf("%w: rank %d's segment %s has a bad header (not this group's rank %d); refusing it", ErrPeerFailed, r, g.names[r], r)
		}
	}
	g.hook("setup:mapped")
	if err := st.Set(ctx, g.prefix+"mapped/r"+strconv.Itoa(rank), []byte{1}); err != nil {
		return fmt.Errorf("publish mapped: %w", err)
	}
	if err := g.waitKeys(ctx, g.rankKeys("mapped/")...); err != nil {
		return fmt.Errorf("wait for every rank to map every segment: %w", err)
	}
	g.hook("setup:unlink")
	g.unlinkAll()
	g.mems = make([][]byte, w)
	for r, s := range g.peers {
		g.mems[r] = s.Bytes()
	}
	g.slotLock = make([]chan struct{}, lay.Slots)
	for i := range g.slotLock {
		g.slotLock[i] = make(chan struct{}, 1)
	}
	g.execs = make([]exec, lay.Slots)
	g.srcs = make([][][]byte, lay.Slots*lay.Lanes)
	g.laneMem = make([]laneMem, lay.Slots*lay.Lanes)
	for i := range g.srcs {
		g.srcs[i] = make([][]byte, 0, w)
	}
	g.startHelpers()
	ok = true
	g.hook("setup:done")
	return nil
}

func (g *Group) rankKeys(sub string) []string {
	keys := make([]string, g.cfg.WorldSize)
	for r := range keys {
		keys[r] = g.prefix + sub + "r" + strconv.Itoa(r)
	}
	return keys
}

// unlinkAll removes every segment name of the group, ignoring names that
// are already gone. It runs after the mapped barrier, when every name is
// known to be this group's.
func (g *Group) unlinkAll() {
	for _, n := range g.names {
		_ = g.prov.Unlink(n) // ErrNotFound: another rank was first
	}
}

// unlinkVerified is the failure path's clean-up: it removes our own name
// and every peer name that shm.RemoveStale accepts: owned by our uid with
// mode 0600 and either empty (a peer killed between creating the file and
// reserving its memory) or of the layout's size carrying this group's
// header for that rank (or none yet). So a rank killed during set-up leaves
// nothing behind, while a file squatted under one of the names by someone
// else (another uid, other permissions, another size) is left alone.
func (g *Group) unlinkVerified() {
	for r, n := range g.names {
		if r == g.cfg.Rank {
			if g.self != nil {
				_ = g.prov.Unlink(n)
			}
			continue
		}
		_, _ = shm.RemoveStale(g.prov, n, g.lay.size(), func(m []byte) bool {
			return loadHdr(m, hdrMagic) == 0 || loadHdr(m, hdrMagic) == magic && loadHdr(m, hdrWorld) == uint64(g.cfg.WorldSize) && loadHdr(m, hdrRank) == uint64(r)
		})
	}
}

func wrapStoreErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rendezvous.ErrTimeout) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return err
}
