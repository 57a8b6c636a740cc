package comm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// callLogLen is how many of its latest calls a GPU communicator keeps for
// diagnose.
const callLogLen = 64

// diagnoseWait bounds how long a rank whose kernel timed out waits for the
// peer's account of its calls (and Config.Timeout bounds it too): a peer
// that mismatched a call times out at about the same moment and answers
// within milliseconds; a dead one never does. A variable for tests.
var diagnoseWait = 2 * time.Second

// callLog holds a GPU communicator's latest calls, numbered from 1 in the
// order Communicator.do resolved them (refused calls included: a call one
// rank refused and its peers ran is the commonest mismatch). Ranks issue
// collectives in one order, so call i of one rank pairs with call i of
// every other. A call captured in a CUDA graph counts once, when captured,
// not at each replay. do adds under Communicator.busy; the lock is for
// diagnose, which may read from another goroutine (Err).
type callLog struct {
	mu   sync.Mutex
	n    int64 // calls so far; call i is at ring[(i-1)%callLogLen]
	ring [callLogLen]fingerprint
}

// add records the next call.
func (l *callLog) add(f fingerprint) {
	l.mu.Lock()
	l.ring[l.n%callLogLen] = f
	l.n++
	l.mu.Unlock()
}

// account returns the calls the log still holds, oldest first.
func (l *callLog) account() callAccount {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := max(l.n-callLogLen, 0) + 1
	a := callAccount{First: first, Calls: make([]fingerprint, 0, l.n-first+1)}
	for i := first; i <= l.n; i++ {
		a.Calls = append(a.Calls, l.ring[(i-1)%callLogLen])
	}
	return a
}

// callAccount is what a rank tells its peers of its latest calls (in the
// store, under callsKey): after a timeout, and at Close or Abort.
type callAccount struct {
	First int64         `json:"first"` // the number of Calls[0]
	Calls []fingerprint `json:"calls"`
	// Ended is "closed" or "aborted" when Close or Abort told it: the
	// rank issues no more.
	Ended string `json:"ended,omitempty"`
}

// last is the number of the latest call, 0 before any.
func (a callAccount) last() int64 { return a.First + int64(len(a.Calls)) - 1 }

// at returns call i, if the account holds it.
func (a callAccount) at(i int64) (fingerprint, bool) {
	if i < a.First || i > a.last() {
		return fingerprint{}, false
	}
	return a.Calls[i-a.First], true
}

// callsKey is the store key of rank r's account.
func callsKey(prefix string, r int) string { return prefix + "calls/" + strconv.Itoa(r) }

// forgetCalls deletes every rank's account (Communicator.forget), best
// effort, rendezvous.KeysInFlight at a time.
func forgetCalls(ctx context.Context, st rendezvous.Store, prefix string, world int) {
	keys := make([]string, world)
	for r := range keys {
		keys[r] = callsKey(prefix, r)
	}
	rendezvous.DeleteKeys(ctx, st, keys...)
}

// callBook is a GPU backend's log of its calls and how it shares it:
// through the store, under the formation's prefix, with this rank's
// peers. gpuComm and hierComm each keep one; Communicator.do adds to it.
type callBook struct {
	log         callLog
	store       rendezvous.Store
	prefix      string
	rank, world int
	timeout     time.Duration // Config.Timeout: bounds every wait, with diagnoseWait
	// stopped is cancelled by Abort (stop): a diagnosis stops waiting.
	stopped context.Context
	stop    context.CancelFunc
}

// newCallBook makes the call book of a formation (prefix) of cfg's group.
func newCallBook(cfg Config, prefix string) *callBook {
	b := &callBook{store: cfg.Store, prefix: prefix, rank: cfg.Rank, world: cfg.WorldSize, timeout: cfg.Timeout}
	b.stopped, b.stop = context.WithCancel(context.Background())
	return b
}

// tell publishes this rank's account of its calls; ended is "" while the
// communicator lives, else "closed" or "aborted".
func (b *callBook) tell(ctx context.Context, ended string) error {
	a := b.log.account()
	a.Ended = ended
	blob, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return b.store.Set(ctx, callsKey(b.prefix, b.rank), blob)
}

// tellEnd is tell at Close or Abort, bounded by the timeout; best effort
// (a store that fails fails what follows, a barrier or leave, too).
func (b *callBook) tellEnd(ended string) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	b.tell(ctx, ended)
}

// diagnose runs when a kernel's timeout first breaks the communicator,
// before the error is returned: it tells this rank's account of its calls
// and waits, for at most diagnoseWait (or Config.Timeout, if shorter, or
// until Abort), for the account of peer, the rank the kernel waited for,
// then says how the two differ (explain). Where the peer issued the same
// calls (it may itself have waited for a third rank), every rank is asked
// too (diagnoseAll). It returns "" when Abort cut it short. The wait is
// paid once per communicator, on the failure path.
func (b *callBook) diagnose(peer int) string {
	if peer < 0 || peer >= b.world || peer == b.rank {
		return ""
	}
	replies, failed := b.ask([]int{peer})
	if replies == nil {
		return failed
	}
	msg := replies[0].msg
	if replies[0].same && b.world > 2 {
		if all := b.diagnoseAll(); all != "" {
			msg += "; asked every rank: " + all
		}
	}
	return msg
}

// diagnoseAll is diagnose for a wait that names no peer (an NCCL
// collective past Config.Timeout): it asks every other rank and names
// those whose calls differ from this rank's or that gave no account, or
// says that every rank issued the same calls.
func (b *callBook) diagnoseAll() string {
	var peers []int
	for r := range b.world {
		if r != b.rank {
			peers = append(peers, r)
		}
	}
	if len(peers) == 0 {
		return ""
	}
	replies, failed := b.ask(peers)
	if replies == nil {
		return failed
	}
	var differ []string
	for _, r := range replies {
		if !r.same {
			differ = append(differ, r.msg)
		}
	}
	switch {
	case len(differ) > 0:
		return strings.Join(differ, "; ")
	case len(replies) == 1:
		return replies[0].msg
	}
	return fmt.Sprintf("every rank issued the same calls as this rank, up to call %d: not a different collective", b.log.account().last())
}

// reply is what ask learnt of one peer: explain's message (or why the
// peer could not tell), and whether its calls are the same as this rank's.
type reply struct {
	msg  string
	same bool
}

// ask tells this rank's account and waits for the peers' (one store Wait
// for all of them, min(diagnoseWait, Config.Timeout) at most), then reads
// those that came, and returns a reply per peer, in order. Replies are nil
// when Abort cut it short (failed "") or when the tell failed (failed
// says why).
func (b *callBook) ask(peers []int) (replies []reply, failed string) {
	wait := min(diagnoseWait, b.timeout)
	ctx, cancel := context.WithTimeout(b.stopped, wait)
	defer cancel()
	if err := b.tell(ctx, ""); err != nil {
		if b.stopped.Err() != nil {
			return nil, ""
		}
		return nil, fmt.Sprintf("telling the peers what this rank issued failed: %v", err)
	}
	keys := make([]string, len(peers))
	for i, p := range peers {
		keys[i] = callsKey(b.prefix, p)
	}
	missing := map[string]bool{}
	werr := b.store.Wait(ctx, keys...)
	if b.stopped.Err() != nil {
		return nil, ""
	}
	var we *rendezvous.WaitError
	switch {
	case errors.As(werr, &we):
		for _, k := range we.Missing {
			missing[k] = true
		}
	case werr != nil:
		for _, k := range keys {
			missing[k] = true
		}
	}
	mine := b.log.account()
	replies = make([]reply, len(peers))
	// The accounts that came exist: reading them does not wait (a fresh
	// bound, since the wait may have used up ctx).
	rctx, rcancel := context.WithTimeout(b.stopped, wait)
	defer rcancel()
	for i, p := range peers {
		if missing[keys[i]] {
			if we == nil {
				replies[i].msg = fmt.Sprintf("asking rank %d what it issued failed: %v", p, werr)
			} else {
				replies[i].msg = fmt.Sprintf("rank %d gave no account of its calls within %v (it is dead, stalled outside collgen, or not yet past its own deadline)", p, wait)
			}
			continue
		}
		var theirs callAccount
		blob, err := b.store.Get(rctx, keys[i])
		switch {
		case err != nil:
			replies[i].msg = fmt.Sprintf("asking rank %d what it issued failed: %v", p, err)
		case json.Unmarshal(blob, &theirs) != nil:
			replies[i].msg = fmt.Sprintf("rank %d's account of its calls is malformed", p)
		default:
			replies[i].msg, replies[i].same = explain(p, mine, theirs)
		}
	}
	return replies, ""
}

// explain says how peer's account of its calls differs from this rank's:
// the first call both hold that differs, else which rank issued more
// calls, else that they agree (same). Only the last callLogLen calls of
// each are compared.
func explain(peer int, mine, theirs callAccount) (msg string, same bool) {
	closed := ""
	if theirs.Ended != "" {
		closed = "; it then " + theirs.Ended + " its communicator"
	}
	for i := max(mine.First, theirs.First); i <= min(mine.last(), theirs.last()); i++ {
		m, _ := mine.at(i)
		t, _ := theirs.at(i)
		if m != t {
			return fmt.Sprintf("rank %d issued a different call %d: %s, where this rank issued %s%s", peer, i, t, m, closed), false
		}
	}
	switch ml, tl := mine.last(), theirs.last(); {
	case tl < ml:
		next := fmt.Sprintf("call %d", tl+1)
		if m, ok := mine.at(tl + 1); ok {
			next += " (" + m.String() + " here)"
		}
		if tl == 0 {
			return fmt.Sprintf("rank %d has issued no collective%s; this rank is at call %d: rank %d has not issued %s", peer, closed, ml, peer, next), false
		}
		t, _ := theirs.at(tl)
		return fmt.Sprintf("rank %d's latest call is %d, %s%s; this rank is at call %d: rank %d has not issued %s", peer, tl, t, closed, ml, peer, next), false
	case tl > ml:
		return fmt.Sprintf("rank %d has issued %d calls and this rank %d, the same ones up to call %d%s", peer, tl, ml, ml, closed), false
	case ml == 0:
		return fmt.Sprintf("neither this rank nor rank %d has issued a collective%s", peer, closed), true
	}
	m, _ := mine.at(mine.last())
	return fmt.Sprintf("rank %d issued the same calls as this rank, up to call %d (%s)%s: not a different collective; it stalled, or itself waited for another rank", peer, mine.last(), m, closed), true
}
