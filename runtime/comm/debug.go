package comm

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// EnvDebugCheck names the environment switch of the debug check mode:
// COLLGEN_DEBUG_CHECK=1 makes every rank, on every collective, exchange a
// fingerprint of the call (collective, count, dtype, op, requested and
// resolved algorithm, zero-copy offset, tag) through the store before
// running it, and fail with ErrMismatch naming the ranks that differ. It
// catches what the kernels cannot see (count 0 on one rank and 8 on
// another, or a symmetric input on one rank only) at the cost of a store
// round trip per call. Set it on every rank or on none.
const EnvDebugCheck = "COLLGEN_DEBUG_CHECK"

// debugCheckEnabled reads EnvDebugCheck: unset, "" or "0" is off, "1" on.
func debugCheckEnabled() (bool, error) {
	switch v := os.Getenv(EnvDebugCheck); v {
	case "", "0":
		return false, nil
	case "1":
		return true, nil
	default:
		return false, errorf(ErrInvalidArgument, "comm: %s=%q: want 1 (on) or 0 (off)", EnvDebugCheck, v)
	}
}

// checker is the debug check mode's state.
type checker struct {
	calls atomic.Int64 // calls checked so far, for messages
	// tags are the explicit Options.Tag values whose calls exchanged
	// their fingerprints under a name of their own (compare): the last
	// rank to leave forgets those names too (Communicator.forget).
	mu   sync.Mutex
	tags map[uint64]struct{}
}

// checkName is the store name a call's fingerprints are exchanged under:
// explicitly tagged host calls may run concurrently, so the tag, not the
// issue order, pairs them.
func checkName(prefix string, tag uint64) string {
	name := prefix + "check"
	if tag != 0 {
		name += "/tag" + strconv.FormatUint(tag, 10)
	}
	return name
}

// usedTag records an explicit tag whose exchange has a name of its own.
func (k *checker) usedTag(tag uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.tags == nil {
		k.tags = map[uint64]struct{}{}
	}
	k.tags[tag] = struct{}{}
}

// names returns the store names of the tagged exchanges this rank made.
func (k *checker) names(prefix string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]string, 0, len(k.tags))
	for tag := range k.tags {
		out = append(out, checkName(prefix, tag))
	}
	return out
}

// fingerprint is what ranks compare in the debug check mode.
type fingerprint struct {
	Collective string `json:"c"`
	Count      int64  `json:"n"`
	DType      string `json:"d"`
	Op         string `json:"o,omitempty"`
	Requested  string `json:"a"`
	Resolved   string `json:"r,omitempty"`
	ZeroCopy   int64  `json:"z"` // input offset in its symmetric buffer, -1 when staged
	Tag        uint64 `json:"t,omitempty"`
	Err        string `json:"e,omitempty"` // this rank could not resolve the call
}

func (f fingerprint) String() string {
	s := fmt.Sprintf("%s of %d %s", f.Collective, f.Count, f.DType)
	if f.Op != "" {
		s += " " + f.Op
	}
	s += ", algorithm " + f.Requested
	if f.Resolved != "" {
		s += " (runs " + f.Resolved + ")"
	}
	if f.ZeroCopy >= 0 {
		s += fmt.Sprintf(", zero-copy at offset %d", f.ZeroCopy)
	}
	if f.Tag != 0 {
		s += fmt.Sprintf(", tag %d", f.Tag)
	}
	if f.Err != "" {
		s += ", refused: " + f.Err
	}
	return s
}

// fingerprintOf describes a resolved call (or one resolve refused).
func fingerprintOf(cl *call, err error) fingerprint {
	f := fingerprint{Collective: string(cl.collective), Count: cl.count, DType: string(cl.dtype), Op: string(cl.op),
		Requested: cl.o.Algorithm.String(), ZeroCopy: -1, Tag: cl.o.Tag}
	if cl.alg != "" {
		f.Resolved = cl.alg.String()
	}
	if cl.zc.on() {
		f.ZeroCopy = cl.zc.offset
	}
	if err != nil {
		f.Err = err.Error()
	}
	return f
}

// compare exchanges the call's fingerprint with every rank. It returns an
// ErrMismatch error naming each rank whose call differs from rank 0's,
// refusals included (every rank returns it, so none runs the call); nil
// when all agree. mine is the call's fingerprint (fingerprintOf), with
// this rank's own refusal, which the caller returns after the exchange.
func (k *checker) compare(c *Communicator, cl *call, mine fingerprint) error {
	n := k.calls.Add(1)
	name := checkName(c.prefix, cl.o.Tag)
	if cl.o.Tag != 0 {
		k.usedTag(cl.o.Tag)
	}
	var fps []fingerprint
	err := c.exchange(cl.o.ctx(), string(cl.collective), func(ctx context.Context) (err error) {
		fps, err = gatherJSON(ctx, c.cfg.Store, name, c.cfg.Rank, c.cfg.WorldSize, mine, EnvDebugCheck+" fingerprint")
		return err
	})
	if err != nil {
		if c.gone(string(cl.collective)) != nil {
			return err // Close or Abort ended it
		}
		return classify(fmt.Errorf("comm: rank %d: %s check of call %d (%s): %w", c.cfg.Rank, EnvDebugCheck, n, mine, err))
	}
	var differ []string
	for r := 1; r < len(fps); r++ {
		if fps[r] != fps[0] {
			differ = append(differ, fmt.Sprintf("rank %d issued %s", r, fps[r]))
		}
	}
	if len(differ) > 0 {
		return errorf(ErrMismatch, "comm: rank %d: %s: call %d differs across ranks: rank 0 issued %s; %s",
			c.cfg.Rank, EnvDebugCheck, n, fps[0], strings.Join(differ, "; "))
	}
	return nil
}
