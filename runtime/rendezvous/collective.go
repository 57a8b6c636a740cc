package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrDuplicateRank is returned (wrapped) by Join when another process has
// already joined the group with the same rank.
var ErrDuplicateRank = errors.New("rendezvous: duplicate rank")

// ErrWorldSizeMismatch is returned (wrapped) by Join when ranks disagree on
// the group's world size.
var ErrWorldSizeMismatch = errors.New("rendezvous: world size mismatch")

// Store keys used by the collectives. Every rank keeps its own generation
// counter per name, so the n-th call of Barrier/AllGather by each rank meets
// the n-th call of every other rank without any local state.
const (
	joinPrefix      = "collgen/join/"
	barrierPrefix   = "collgen/barrier/"
	allGatherPrefix = "collgen/allgather/"
)

// MaxWorldSize bounds the world sizes that Join, Barrier, AllGather,
// ForgetAllGather, ForgetBarrier and ReadEnv take (1,048,576 ranks): every
// rendezvous names one store key per rank, so a world size from a typo
// (WORLD_SIZE=10000000000) would take the process's memory before any
// store could refuse it. It is far beyond what a store serves (a TCP
// server takes 1024 connections by default) and what the kernels are
// generated for (4096 ranks at most).
const MaxWorldSize = 1 << 20

func checkRank(rank, world int) error {
	if world < 1 {
		return argError(fmt.Sprintf("rendezvous: world size %d: want at least 1", world))
	}
	if world > MaxWorldSize {
		return argError(fmt.Sprintf("rendezvous: world size %d: want at most %d (MaxWorldSize)", world, MaxWorldSize))
	}
	if rank < 0 || rank >= world {
		return argError(fmt.Sprintf("rendezvous: rank %d is out of range for world size %d (want 0..%d)", rank, world, world-1))
	}
	return nil
}

// argError is a refused rank or world size: it matches ErrInvalidArgument
// (errors.Is) and reads as its own text alone, as these errors always have.
type argError string

func (e argError) Error() string { return string(e) }

// Is makes errors.Is(err, ErrInvalidArgument) hold.
func (e argError) Is(target error) bool { return target == ErrInvalidArgument }

// checkStore refuses a nil store, naming op, with an error wrapping
// ErrInvalidArgument (the store's methods would panic on it): an interface
// holding nothing, or a nil pointer (a `var s *MemStore` passed as a Store).
func checkStore(op string, s Store) error {
	if s == nil {
		return fmt.Errorf("%w: %s: the store is nil", ErrInvalidArgument, op)
	}
	if v := reflect.ValueOf(s); v.Kind() == reflect.Pointer && v.IsNil() {
		return fmt.Errorf("%w: %s: the store is a nil %T", ErrInvalidArgument, op, s)
	}
	return nil
}

// Join registers rank in group and waits until all world ranks have joined.
// It refuses a rank that already joined (ErrDuplicateRank) and a world size
// different from the one the first rank registered (ErrWorldSizeMismatch,
// naming both sizes); the refused rank also records the mismatch in the
// store, so ranks already waiting in Join fail at once with the same error
// instead of waiting out their deadline. On timeout it returns a
// *MissingRanksError. A group name is joined once; use a fresh name (or a
// run id, see OpenRun) to re-form it. A nil store is an error wrapping
// ErrInvalidArgument.
func Join(ctx context.Context, s Store, group string, rank, world int) error {
	if err := checkStore("Join", s); err != nil {
		return err
	}
	if err := checkRank(rank, world); err != nil {
		return err
	}
	ctx, cancel := WithDefaultTimeout(ctx, DefaultTimeout)
	defer cancel()
	after := waitBudget(ctx)
	prefix := joinPrefix + group + "/"
	ws := []byte(strconv.Itoa(world))
	cur, swapped, err := s.CompareAndSet(ctx, prefix+"world", nil, ws)
	if err != nil {
		return fmt.Errorf("rendezvous: join group %q: %w", group, err)
	}
	if !swapped && string(cur) != string(ws) {
		msg := fmt.Sprintf("group %q: rank %d has world size %d but the group was formed with world size %s; start every rank with the same world size",
			group, rank, world, cur)
		// Tell the ranks waiting for the group (best effort: the first
		// mismatch recorded wins).
		s.CompareAndSet(ctx, prefix+"mismatch", nil, []byte(msg))
		return fmt.Errorf("%w: %s", ErrWorldSizeMismatch, msg)
	}
	var tok [8]byte
	rand.Read(tok[:])
	keys := rankKeys(prefix+"rank/", world)
	_, swapped, err = s.CompareAndSet(ctx, keys[rank], nil, []byte(hex.EncodeToString(tok[:])))
	if err != nil {
		return fmt.Errorf("rendezvous: join group %q: %w", group, err)
	}
	if !swapped {
		return fmt.Errorf("%w: group %q: rank %d has already joined; give each process its own rank (or, when rerunning, a new run id: an earlier run with the same id on this store left its keys)", ErrDuplicateRank, group, rank)
	}
	return waitJoin(ctx, s, prefix, keys, after)
}

// waitJoin waits for every rank's key, or for a recorded world-size
// mismatch, whichever comes first. Both waits have ended when it returns.
func waitJoin(ctx context.Context, s Store, prefix string, keys []string, after time.Duration) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	joined := make(chan error, 1)
	go func() { joined <- waitRanks(wctx, s, keys, after) }()
	mismatch := make(chan []byte, 1)
	go func() {
		v, err := s.Get(wctx, prefix+"mismatch")
		if err != nil {
			v = nil
		}
		mismatch <- v
	}()
	select {
	case err := <-joined:
		cancel()
		<-mismatch
		return err
	case v := <-mismatch:
		if v == nil { // the wait ended without a mismatch
			return <-joined
		}
		cancel()
		<-joined
		return fmt.Errorf("%w: %s", ErrWorldSizeMismatch, v)
	}
}

// Barrier returns once all world ranks have called it with the same name
// (for the same number of times). It may be called any number of times with
// one name. On timeout it returns a *MissingRanksError naming the ranks that
// had not arrived. A nil store is an error wrapping ErrInvalidArgument.
func Barrier(ctx context.Context, s Store, name string, rank, world int) error {
	if err := checkStore("Barrier", s); err != nil {
		return err
	}
	_, err := gather(ctx, s, barrierPrefix+name+"/", rank, world, nil, false)
	return err
}

// AllGather contributes blob from rank and returns every rank's blob,
// indexed by rank. Like Barrier it is reusable with one name and names the
// missing ranks on timeout. A nil store is an error wrapping
// ErrInvalidArgument.
func AllGather(ctx context.Context, s Store, name string, rank, world int, blob []byte) ([][]byte, error) {
	if err := checkStore("AllGather", s); err != nil {
		return nil, err
	}
	return gather(ctx, s, allGatherPrefix+name+"/", rank, world, blob, true)
}

// ForgetAllGather deletes the keys AllGather under name keeps between calls
// (each rank's generation counter and last entry), and ForgetBarrier those
// of Barrier: call it once no rank will use the name again (say, the last
// rank to leave a group), so a long-lived store does not keep them. The
// keys go KeysInFlight at a time (Counters, DeleteKeys): keys already
// gone are no error, and the error names the first key that failed. A
// nil store or a world size below 1 or above MaxWorldSize is an error
// wrapping ErrInvalidArgument.
func ForgetAllGather(ctx context.Context, s Store, name string, world int) error {
	return forget(ctx, "ForgetAllGather", s, allGatherPrefix+name+"/", world)
}

// ForgetBarrier is ForgetAllGather for Barrier's keys.
func ForgetBarrier(ctx context.Context, s Store, name string, world int) error {
	return forget(ctx, "ForgetBarrier", s, barrierPrefix+name+"/", world)
}

// forget deletes every rank's generation counter under prefix and its
// entries: counters read, then keys deleted, KeysInFlight at a time (one
// round trip per key at world 64 made closing a group take hundreds of
// them in a row). A rank's entries are a run of generations ending at its
// counter (gather deletes those below one that completed), usually the
// last one or two; calls that failed while a peer was away leave a longer
// run, so deletion goes on down a rank's generations until one is
// already gone. op names the caller in a refusal.
func forget(ctx context.Context, op string, s Store, prefix string, world int) error {
	if err := checkStore(op, s); err != nil {
		return err
	}
	if world < 1 {
		return fmt.Errorf("%w: %s: world size %d: want at least 1", ErrInvalidArgument, op, world)
	}
	if world > MaxWorldSize {
		return fmt.Errorf("%w: %s: world size %d: want at most %d (MaxWorldSize)", ErrInvalidArgument, op, world, MaxWorldSize)
	}
	counters := make([]string, world)
	for r := range counters {
		counters[r] = prefix + "gen/" + strconv.Itoa(r)
	}
	gens, rerr := Counters(ctx, s, counters...) // creates missing counters, deleted below
	entry := func(r int, gen int64) string { return prefix + strconv.FormatInt(gen, 10) + "/" + strconv.Itoa(r) }
	// The first round: each rank's last two entries and the counters.
	type older struct {
		rank int
		gen  int64
	}
	var keys []string
	var next []older // the entry below each rank's second-to-last, if any
	for r, g := range gens {
		for _, gen := range []int64{g - 1, g} {
			if gen > 0 {
				keys = append(keys, entry(r, gen))
			}
		}
		if g > 2 {
			next = append(next, older{r, g - 2})
		}
	}
	keys = append(keys, counters...)
	existed := make(map[string]bool, len(keys))
	var mu sync.Mutex
	del := func(keys []string) error {
		errs := each(ctx, len(keys), func(i int) error {
			ok, err := s.Delete(ctx, keys[i])
			mu.Lock()
			existed[keys[i]] = ok
			mu.Unlock()
			return err
		})
		return keysErr("delete", keys, errs)
	}
	derr := del(keys)
	// Then down each rank's run of older entries (left by failed calls),
	// one generation a round, while the one above was still there.
	for len(next) > 0 && ctx.Err() == nil {
		var round []older
		keys = keys[:0]
		for _, o := range next {
			if existed[entry(o.rank, o.gen+1)] {
				round = append(round, o)
				keys = append(keys, entry(o.rank, o.gen))
			}
		}
		if err := del(keys); err != nil && derr == nil {
			derr = err
		}
		next = next[:0]
		for _, o := range round {
			if o.gen > 1 {
				next = append(next, older{o.rank, o.gen - 1})
			}
		}
	}
	if rerr != nil {
		return rerr
	}
	return derr
}

// gather is the generation-counted exchange behind Barrier and AllGather.
// Generation g of rank r lives at prefix+"g/r". When generation g completes,
// every rank has finished generation g-1 (it could not have published g
// otherwise), so rank r deletes its own g-1 entry: a name holds at most two
// generations. A call that fails leaves its entry (a peer that comes later
// still meets it); the rank's next call that completes deletes it, and
// forget finds such runs of entries too.
func gather(ctx context.Context, s Store, prefix string, rank, world int, blob []byte, fetch bool) ([][]byte, error) {
	if err := checkRank(rank, world); err != nil {
		return nil, err
	}
	ctx, cancel := WithDefaultTimeout(ctx, DefaultTimeout)
	defer cancel()
	after := waitBudget(ctx)
	g, err := s.Add(ctx, prefix+"gen/"+strconv.Itoa(rank), 1)
	if err != nil {
		return nil, err
	}
	keys := rankKeys(prefix+strconv.FormatInt(g, 10)+"/", world)
	if blob == nil {
		blob = []byte{}
	}
	if err := s.Set(ctx, keys[rank], blob); err != nil {
		return nil, err
	}
	if err := waitRanks(ctx, s, keys, after); err != nil {
		return nil, err
	}
	var out [][]byte
	if fetch {
		out = make([][]byte, world)
		for i, k := range keys {
			if out[i], err = s.Get(ctx, k); err != nil {
				return nil, err
			}
		}
	}
	// Every rank has published generation g, so every rank is done with
	// the earlier ones: this rank's entries below g go, newest first, down
	// to the first already gone (those below it went with it). Usually
	// that is g-1 alone; a call that failed (its entry stays, for peers
	// still to come) leaves one more each. Best effort: a leftover key
	// only costs memory until forget.
	for old := g - 1; old > 0; old-- {
		if ok, err := s.Delete(ctx, prefix+strconv.FormatInt(old, 10)+"/"+strconv.Itoa(rank)); err != nil || !ok {
			break
		}
	}
	return out, nil
}

// rankKeys returns prefix+"0" … prefix+"world-1".
func rankKeys(prefix string, world int) []string {
	keys := make([]string, world)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// waitBudget is the time left before ctx's deadline, which MissingRanksError
// reports as how long the ranks were waited for.
func waitBudget(ctx context.Context) time.Duration {
	dl, _ := ctx.Deadline()
	return time.Until(dl)
}

// waitRanks waits for keys[r] of every rank r, turning a WaitError into a
// MissingRanksError.
func waitRanks(ctx context.Context, s Store, keys []string, after time.Duration) error {
	err := s.Wait(ctx, keys...)
	var we *WaitError
	if !errors.As(err, &we) {
		return err
	}
	e := &MissingRanksError{World: len(keys), After: after}
	for _, k := range we.Missing {
		r, err := strconv.Atoi(k[strings.LastIndexByte(k, '/')+1:])
		if err != nil {
			return we
		}
		e.Missing = append(e.Missing, r)
	}
	e.Joined = e.World - len(e.Missing)
	return e
}
