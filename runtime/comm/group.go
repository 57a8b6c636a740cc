package comm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/collgen/collgen/runtime/host"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// Store keys of group formation. Under "collgen/comm/<group>/":
//
//	world      "<world size>/<nonce>", set by the first rank to arrive (CAS);
//	           removed by the last member to leave
//
// and under Communicator.prefix, "collgen/comm/<group>/<nonce>/", so every
// formation of a group name starts with fresh keys and fresh generation
// counters:
//
//	rank/<r>   rank r's claim, set once (CAS); deleted by its Close
//	members    how many ranks hold a claim
//	poison     a counter, nonzero once a rank found the group cannot form
//	why        why, set before poison is bumped
//	agree      the all-gathered membership records
//	closing    set by the first rank to leave once it has exchanged
//	           anything: a rank joining then backs out and waits for a
//	           new formation
//
// A group name is formed once at a time per store: a second rank with the
// same index is refused (ErrMismatch) before it touches anything the live
// rank owns (no segment, no device memory), and the name can be formed
// again once every member has closed.

// pollEvery is how often a rank waiting for the others to join looks at
// the poison counter.
const pollEvery = 20 * time.Millisecond

// membership is what every rank publishes once all have joined; all must
// match.
type membership struct {
	World   int    `json:"world"`
	Backend string `json:"backend"` // "gpu", "host" or "host-shared"
	Library string `json:"library"` // sha256 of the library's manifest
	Host    string `json:"host"`    // the rank's host id (hosts.go); not compared
	// Rules is sha256 of Config.MultiHostRules ("" when unset): a group
	// spanning hosts selects by them, and every rank must choose alike.
	Rules string `json:"rules"`
	// HostRules names the host_shm topology whose rules choose each
	// collective on host ranks (Config.Topology resolved; "" on GPUs,
	// whose set-up agreement compares the topology).
	HostRules string `json:"host_rules"`
	// DebugCheck (EnvDebugCheck) makes every call exchange its
	// fingerprint, on any backend: a rank alone with it waits for peers
	// that never come.
	DebugCheck bool `json:"debug_check"`
	// Process names the rank's process where the group is an in-process
	// host group (Device Host, HostShared false: memory shared among
	// goroutines only), "" otherwise: ranks of such a group in other
	// processes could never map each other's segments.
	Process string `json:"process,omitempty"`
}

// processToken identifies this process among a group's ranks.
var processToken = func() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// processOf is the process a rank's membership record names (a variable
// so that tests can put goroutine ranks in "processes" of their own).
var processOf = func(Config) string { return processToken }

// form joins the group: it claims the world size and this rank through the
// store, waits for every rank (failing fast when another rank poisons the
// group) and then checks that every rank has the same membership record.
// Every failure names both values and wraps ErrMismatch or ErrTimeout.
//
// A formation one of whose ranks has left after the membership exchange
// (closed, aborted, or failed in set-up) is not joined: a rank that
// closes a group and forms it again at once can read the world record
// before its peers have all left and removed it, and would meet that
// formation's keys (a host group's nonce and segment names, the NCCL id,
// the IPC records). It backs out and waits for the record to change (the
// last rank to leave removes it).
func (c *Communicator) form(ctx context.Context) error {
	wait := ctx // bounds waiting for a closing formation
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, rendezvous.DefaultTimeout)
		defer cancel()
	}
	var stale []byte
	for {
		retry, err := c.join(ctx, wait, stale)
		if !retry {
			return err
		}
		stale = c.record
	}
}

// join is one attempt of form. It reports retry where the formation it
// found (whose record form passes back as stale) is closing; a world
// record equal to stale is waited out, until wait ends.
func (c *Communicator) join(ctx, wait context.Context, stale []byte) (retry bool, err error) {
	cfg, st := c.cfg, c.cfg.Store
	base := "collgen/comm/" + cfg.Group + "/"
	var nonce [8]byte
	rand.Read(nonce[:])
	ws := strconv.Itoa(cfg.WorldSize)
	var cur []byte
	for {
		cur, _, err = st.CompareAndSet(ctx, base+"world", nil, []byte(ws+"/"+hex.EncodeToString(nonce[:])))
		if err != nil {
			return false, classify(fmt.Errorf("comm: rank %d: join group %q: %w", cfg.Rank, cfg.Group, err))
		}
		if stale == nil || !bytes.Equal(cur, stale) {
			break
		}
		if err := waitStale(wait); err != nil {
			return false, errorf(ErrTimeout, "comm: rank %d: group %q did not form: an earlier formation of it is closing, and not every one of its ranks left in time (closed, aborted, or gave up forming): %w",
				cfg.Rank, cfg.Group, err)
		}
	}
	formed, id, ok := strings.Cut(string(cur), "/")
	if !ok {
		return false, errorf(ErrMismatch, "comm: rank %d: store key %sworld holds %q, not a group record; is another program using group %q?", cfg.Rank, base, cur, cfg.Group)
	}
	c.base, c.id, c.prefix, c.record = base, id, base+id+"/", cur
	if formed != ws {
		return false, c.poison(ctx, fmt.Sprintf("rank %d has world size %d, but group %q was formed with world size %s; start every rank with the same world size",
			cfg.Rank, cfg.WorldSize, cfg.Group, formed))
	}
	var tok [8]byte
	rand.Read(tok[:])
	_, swapped, err := st.CompareAndSet(ctx, c.rankKey(cfg.Rank), nil, []byte(hex.EncodeToString(tok[:])))
	if err != nil {
		return false, classify(fmt.Errorf("comm: rank %d: join group %q: %w", cfg.Rank, cfg.Group, err))
	}
	if !swapped {
		// Not poisoned: the group with the first holder of this rank may
		// be running, and this caller must not disturb it.
		return false, errorf(ErrMismatch, "comm: rank %d of group %q has already joined (another process or goroutine was given the same rank, or an earlier run left its keys on this store); give each rank its own Config.Rank, name a new Config.Group, or start the run with a new run id (COLLGEN_RUN_ID, collgen run --run-id)",
			cfg.Rank, cfg.Group)
	}
	if _, err := st.Add(ctx, c.prefix+"members", 1); err != nil {
		return false, errors.Join(classify(fmt.Errorf("comm: rank %d: join group %q: %w", cfg.Rank, cfg.Group, err)), c.leave())
	}
	// Poisoned first: a late rank of a group that cannot form fails with
	// the reason, as the ranks that stayed do.
	if err := c.poisoned(ctx); err != nil {
		return false, errors.Join(err, c.leave())
	}
	closing, err := c.closing(ctx)
	if err != nil {
		return false, errors.Join(classify(fmt.Errorf("comm: rank %d: join group %q: %w", cfg.Rank, cfg.Group, err)), c.leave())
	}
	if closing {
		if err := c.leave(); err != nil {
			return false, err
		}
		return true, nil
	}
	if err := c.agree(ctx); err != nil {
		return false, errors.Join(err, c.leave())
	}
	return false, nil
}

// closing reports whether a rank of this formation has left after
// exchanging anything (leave marks it before giving up its claim) or its
// world record is gone or replaced (every member left). The mark is read
// before the record: the last rank to leave removes the record before the
// mark (forget).
func (c *Communicator) closing(ctx context.Context) (bool, error) {
	st := c.cfg.Store
	// Neither key's value is ever "-": nothing is swapped, only read.
	left, _, err := st.CompareAndSet(ctx, c.prefix+"closing", []byte("-"), []byte("-"))
	if err != nil || left != nil {
		return left != nil, err
	}
	cur, _, err := st.CompareAndSet(ctx, c.base+"world", []byte("-"), []byte("-"))
	return !bytes.Equal(cur, c.record), err
}

// waitStale waits one poll interval for a closing formation's ranks to
// leave, or returns ctx's error.
func waitStale(ctx context.Context) error {
	t := time.NewTimer(pollEvery)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// gatherJSON exchanges one JSON record per rank under key and returns
// every rank's, by rank. A failed exchange is returned as the store gave
// it (the caller says what was exchanged); a record that does not decode
// is ErrMismatch naming the rank and what (the record's name).
func gatherJSON[T any](ctx context.Context, st rendezvous.Store, key string, rank, world int, mine T, what string) ([]T, error) {
	blob, err := json.Marshal(mine)
	if err != nil {
		return nil, fmt.Errorf("comm: rank %d: encode %s: %w", rank, what, err)
	}
	all, err := rendezvous.AllGather(ctx, st, key, rank, world, blob)
	if err != nil {
		return nil, err
	}
	recs := make([]T, len(all))
	for r, b := range all {
		if err := json.Unmarshal(b, &recs[r]); err != nil {
			return nil, errorf(ErrMismatch, "comm: rank %d sent a malformed %s: %w", r, what, err)
		}
	}
	return recs, nil
}

// agree waits for every rank to join and checks their membership records.
func (c *Communicator) agree(ctx context.Context) error {
	cfg, st := c.cfg, c.cfg.Store
	if err := c.waitJoined(ctx); err != nil {
		return err
	}
	mine := membership{World: cfg.WorldSize, Backend: "gpu", Library: fmt.Sprintf("%x", sha256.Sum256([]byte(cfg.Library.Manifest))), Host: c.hostID,
		DebugCheck: c.check != nil}
	if cfg.MultiHostRules != nil {
		b, _ := json.Marshal(cfg.MultiHostRules) // maps marshal in key order
		mine.Rules = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	if cfg.Device == Host {
		mine.Backend = "host"
		if cfg.HostShared {
			mine.Backend = "host-shared"
		}
		mine.HostRules = hostRulesNames(cfg.Library, cfg.Topology, cfg.WorldSize)
		if !cfg.HostShared {
			mine.Process = processOf(cfg)
		}
	}
	c.exchanged = true
	all, err := gatherJSON(ctx, st, c.prefix+"agree", cfg.Rank, cfg.WorldSize, mine, "membership record")
	if err != nil {
		return classify(fmt.Errorf("comm: rank %d: agree on membership of group %q: %w", cfg.Rank, cfg.Group, err))
	}
	hosts := make([]string, len(all))
	for r, m := range all {
		switch {
		case m.Backend != mine.Backend:
			return errorf(ErrMismatch, "comm: rank %d uses the %s backend, rank %d the %s backend; pass the same kind of Config.Device (a GPU ordinal, or comm.Host) and HostShared on every rank",
				r, m.Backend, cfg.Rank, mine.Backend)
		case m.Library != mine.Library:
			return errorf(ErrMismatch, "comm: rank %d uses a different generated library than rank %d (manifest hash %.12s, here %.12s); build every rank from the same generated code",
				r, cfg.Rank, m.Library, mine.Library)
		case m.HostRules != mine.HostRules:
			return errorf(ErrMismatch, "comm: rank %d chooses by the host_shm rules of %s, rank %d by those of %s; pass the same Config.Topology on every rank (or none)",
				r, m.HostRules, cfg.Rank, mine.HostRules)
		case m.Rules != mine.Rules:
			return errorf(ErrMismatch, "comm: rank %d passed other Config.MultiHostRules than rank %d; pass the same rules (or none) on every rank",
				r, cfg.Rank)
		case m.Process != mine.Process:
			return errorf(ErrInvalidArgument, "comm: rank %d runs in another process than rank %d, and Config.HostShared is false (an in-process host group shares memory among goroutines only); set HostShared: true on every rank when ranks are processes (collgen run, torchrun)",
				r, cfg.Rank)
		case m.DebugCheck != mine.DebugCheck:
			return errorf(ErrMismatch, "comm: rank %d has the debug check %s, rank %d has it %s; set %s alike for every rank",
				r, onOff(m.DebugCheck), cfg.Rank, onOff(mine.DebugCheck), EnvDebugCheck)
		}
		hosts[r] = m.Host
	}
	// A rank that found a mismatch after this one joined (say a third rank
	// with another world size) fails every rank that has not returned yet.
	if err := c.poisoned(ctx); err != nil {
		return err
	}
	// Every rank groups the same ids, so all agree on the layout (and on
	// refusing unequal hosts).
	c.layout, err = groupHosts(hosts)
	return err
}

// onOff says on or off.
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func (c *Communicator) rankKey(r int) string { return c.prefix + "rank/" + strconv.Itoa(r) }

// poison records why the group cannot form, so ranks waiting for it fail
// at once instead of timing out, and returns that reason as an error.
func (c *Communicator) poison(ctx context.Context, why string) error {
	st := c.cfg.Store
	if err := st.Set(ctx, c.prefix+"why", []byte(why)); err == nil {
		st.Add(ctx, c.prefix+"poison", 1)
	}
	return errorf(ErrMismatch, "comm: %s", why)
}

// poisoned returns the group's poison as an ErrMismatch error, or nil.
func (c *Communicator) poisoned(ctx context.Context) error {
	st := c.cfg.Store
	n, err := st.Add(ctx, c.prefix+"poison", 0)
	if err != nil || n == 0 {
		return classify(err)
	}
	why, _ := st.Get(ctx, c.prefix+"why")
	return errorf(ErrMismatch, "comm: rank %d: group %q cannot form: %s", c.cfg.Rank, c.cfg.Group, why)
}

// waitJoined waits until every rank has claimed its index, checking the
// poison counter between short waits.
func (c *Communicator) waitJoined(ctx context.Context) error {
	cfg := c.cfg
	keys := make([]string, cfg.WorldSize)
	for r := range keys {
		keys[r] = c.rankKey(r)
	}
	if _, ok := ctx.Deadline(); !ok {
		// Ranks may start minutes apart (process launch, driver
		// initialisation): the rendezvous default bounds the join.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rendezvous.DefaultTimeout)
		defer cancel()
	}
	// seen marks the ranks whose claim some wait found: one that joined
	// and gave up (leaving) before the deadline is not the one missing.
	seen := make([]bool, len(keys))
	for {
		wctx, wcancel := context.WithTimeout(ctx, pollEvery)
		err := cfg.Store.Wait(wctx, keys...)
		wcancel()
		if err == nil {
			return nil
		}
		var we *rendezvous.WaitError
		if errors.As(err, &we) {
			for r, k := range keys {
				if !slices.Contains(we.Missing, k) {
					seen[r] = true
				}
			}
		}
		if perr := c.poisoned(ctx); perr != nil {
			return perr
		}
		if ctx.Err() != nil {
			var ranks []int
			for r := range keys {
				if !seen[r] {
					ranks = append(ranks, r)
				}
			}
			missing := fmt.Sprintf("; missing ranks %v (never joined this store's group)", ranks)
			return errorf(ErrTimeout, "comm: rank %d: group %q did not form: not every one of %d ranks joined in time%s: %w", cfg.Rank, cfg.Group, cfg.WorldSize, missing, ctx.Err())
		}
		if !errors.Is(err, rendezvous.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return classify(fmt.Errorf("comm: rank %d: join group %q: %w", cfg.Rank, cfg.Group, err))
		}
	}
}

// leave gives up this rank's claim on the group name; the last member to
// leave removes the world record, so the name can be formed again.
func (c *Communicator) leave() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	st := c.cfg.Store
	// Marked before the claim goes: a rank joining now backs out (join).
	// A rank that leaves before exchanging anything (its wait for the
	// others ended) leaves the formation joinable: it can retry New.
	if c.exchanged {
		if err := st.Set(ctx, c.prefix+"closing", []byte{1}); err != nil {
			return classify(fmt.Errorf("comm: rank %d: leave group %q: %w", c.cfg.Rank, c.cfg.Group, err))
		}
	}
	if _, err := st.Delete(ctx, c.rankKey(c.cfg.Rank)); err != nil {
		return classify(fmt.Errorf("comm: rank %d: leave group %q: %w", c.cfg.Rank, c.cfg.Group, err))
	}
	n, err := st.Add(ctx, c.prefix+"members", -1)
	if err != nil {
		return classify(fmt.Errorf("comm: rank %d: leave group %q: %w", c.cfg.Rank, c.cfg.Group, err))
	}
	// Below 0: the last member's forget deleted the counter after a rank
	// joining (which then backs out, join) had counted itself; it is the
	// last now.
	if n <= 0 {
		// Only this formation's record: a new one may already be forming.
		if _, same, err := st.CompareAndSet(ctx, c.base+"world", c.record, c.record); err == nil && same {
			st.Delete(ctx, c.base+"world")
		}
		c.forget(ctx)
	}
	return nil
}

// forget deletes, once the last member has left, the keys this formation
// left in the store (they are under its own prefix, so no other formation
// reads them): the member counter, an unraised poison counter (a raised
// one, and its why, stay for ranks still arriving to read), the
// membership exchange, the debug check's, the GPU set-up's exchanges and
// barriers (detection, set-up records, UseSymmetric, ready, close), the
// ranks' accounts of their calls (forgetCalls), the host group's set-up
// keys, and the devices' own (NCCL ids, the region's
// IPC records, the pools behind Alloc: forgetDeviceKeys, forgetHierKeys),
// named from the formation, not from what this rank's device did: the
// last to leave may not have opened NCCL or its device at all. A process
// forming and closing groups on one long-lived store kept about a dozen
// keys per formation, and a GPU group's device about four per rank more.
// Best effort: a key left behind costs only memory. Left: the symmetric
// pools' store-wide notes (one key per rank number, rewritten by every
// pool) and a raised poison.
func (c *Communicator) forget(ctx context.Context) {
	st, world := c.cfg.Store, c.cfg.WorldSize
	st.Delete(ctx, c.prefix+"members")
	st.Delete(ctx, c.prefix+"closing") // after the world record (closing)
	if n, err := st.Add(ctx, c.prefix+"poison", 0); err == nil && n == 0 {
		st.Delete(ctx, c.prefix+"poison")
	}
	for _, name := range []string{"agree", "check", "detect/bus", "detect/view", "gpu", "usesymm", "window"} {
		rendezvous.ForgetAllGather(ctx, st, c.prefix+name, world)
	}
	for _, name := range []string{"ready", "close"} {
		rendezvous.ForgetBarrier(ctx, st, c.prefix+name, world)
	}
	if c.check != nil {
		// The debug check's exchanges of explicitly tagged calls, one
		// name per tag: every rank's calls carry the same tags.
		for _, name := range c.check.names(c.prefix) {
			rendezvous.ForgetAllGather(ctx, st, name, world)
		}
	}
	if c.cfg.Device == Host && c.id != "" {
		host.Forget(ctx, st, c.cfg.Group+"/"+c.id, world)
	}
	if c.cfg.Device != Host {
		forgetCalls(ctx, st, c.prefix, world)
	}
	switch {
	case c.layout.multi():
		forgetHierKeys(ctx, st, c.prefix, c.layout.perHost())
	case c.cfg.Device != Host: // whichever ranks opened NCCL, set up or formed a pool
		forgetDeviceKeys(ctx, st, c.prefix, world)
	}
}
