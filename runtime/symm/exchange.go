//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// exchange publishes blob as this rank's entry of the next generation of
// prefix and returns every rank's entry, indexed by rank. Generation g of
// rank r lives at prefix+"<g>/r<r>", g counted per rank at prefix+"gen/r<r>",
// so the n-th exchange of every rank meets the n-th of every other.
//
// check vets each entry (this rank's included) before the exchange
// returns. Rank 0's entry is read and checked first: every rank compares
// with the same reference, so a rank that disagrees with rank 0 (on world
// size, say, which decides how many entries there are) fails as soon as
// rank 0 has published instead of waiting for ranks that will never come,
// and rank 0 fails on the disagreeing rank's entry. When the deadline
// passes, the entries that did arrive are still checked, since a
// disagreement explains more than a timeout does.
//
// A failed wait (a missing rank, a cancelled ctx, a store error) withdraws
// this rank's entry and takes its generation back, so that when every rank
// calls again their generations meet again, as they would have. A failed
// check does not: every rank sees the same entries fail, so all stay at
// the same generation. (A rank that gave up at the very moment a late
// peer read its entry can still leave that peer holding it; callers that
// must know say so in a second exchange: NewPool's digest round.)
//
// It returns the generation too, for retract.
func exchange(ctx context.Context, st rendezvous.Store, prefix string, rank, world int, blob []byte, check func(r int, b []byte) error) ([][]byte, int64, error) {
	start := time.Now()
	g, err := st.Add(ctx, prefix+"gen/r"+strconv.Itoa(rank), 1)
	if err != nil {
		return nil, 0, fmt.Errorf("count exchanges: %w", err)
	}
	keys := make([]string, world)
	for r := range keys {
		keys[r] = prefix + strconv.FormatInt(g, 10) + "/r" + strconv.Itoa(r)
	}
	withdraw := func(err error) error {
		retract(ctx, st, prefix, rank, g)
		return err
	}
	if err := st.Set(ctx, keys[rank], blob); err != nil {
		return nil, 0, withdraw(fmt.Errorf("publish: %w", err))
	}
	out := make([][]byte, world)
	get := func(r int) error {
		b, err := st.Get(ctx, keys[r])
		if err != nil {
			return withdraw(late(ctx, st, keys, check, time.Since(start), err))
		}
		if err := check(r, b); err != nil {
			return err
		}
		out[r] = b
		return nil
	}
	if err := get(0); err != nil {
		return nil, 0, err
	}
	// The rest at once, so that a timeout names every missing rank.
	if err := st.Wait(ctx, keys...); err != nil {
		return nil, 0, withdraw(late(ctx, st, keys, check, time.Since(start), err))
	}
	for r := 1; r < world; r++ {
		if err := get(r); err != nil {
			return nil, 0, err
		}
	}
	if g > 1 {
		// Every rank has published generation g, so every rank is done
		// reading g-1: our old entry can go (best effort, it only costs
		// store memory).
		st.Delete(ctx, prefix+strconv.FormatInt(g-1, 10)+"/r"+strconv.Itoa(rank))
	}
	return out, g, nil
}

// forgetExchanges deletes every rank's entries and generation counter of
// the exchanges under each of prefixes: the last generation's entry of
// each rank and the one before it (exchange deletes older ones as it
// goes, and a rank may not have deleted its previous entry yet). The
// counters are read, then the keys deleted, rendezvous.KeysInFlight at a
// time. Best effort; the first store error is returned after every key
// was tried.
func forgetExchanges(ctx context.Context, st rendezvous.Store, world int, prefixes ...string) error {
	var counters []string
	for _, prefix := range prefixes {
		for r := range world {
			counters = append(counters, prefix+"gen/r"+strconv.Itoa(r))
		}
	}
	gens, rerr := rendezvous.Counters(ctx, st, counters...) // creates missing counters, deleted below
	var keys []string
	for i, g := range gens {
		prefix, rk := prefixes[i/world], "/r"+strconv.Itoa(i%world)
		for _, gen := range []int64{g - 1, g} {
			if gen > 0 {
				keys = append(keys, prefix+strconv.FormatInt(gen, 10)+rk)
			}
		}
	}
	derr := rendezvous.DeleteKeys(ctx, st, append(keys, counters...)...)
	if rerr != nil {
		return rerr
	}
	return derr
}

// retract withdraws this rank's entry of generation g of prefix and takes
// the generation back: exchange does after a failed wait, and a caller
// whose later step failed does for an exchange that succeeded. Best
// effort, with a second of its own: a store that fails here has failed
// the caller already.
func retract(ctx context.Context, st rendezvous.Store, prefix string, rank int, g int64) {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	st.Delete(c, prefix+strconv.FormatInt(g, 10)+"/r"+strconv.Itoa(rank))
	st.Add(c, prefix+"gen/r"+strconv.Itoa(rank), -1)
}

// late explains a failed wait: a disagreement among the entries that did
// arrive if there is one, else which ranks are missing (wrapping ErrTimeout
// and a *rendezvous.MissingRanksError). Errors other than a passed
// deadline (a closed store, a cancelled ctx) are returned as they are.
func late(ctx context.Context, st rendezvous.Store, keys []string, check func(int, []byte) error, waited time.Duration, err error) error {
	if !errors.Is(err, rendezvous.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// The caller's ctx has expired; look once more with a little time of
	// our own: a short wait to learn which keys are missing, then reads
	// of the ones present.
	base := context.WithoutCancel(ctx)
	cw, cancelW := context.WithTimeout(base, 100*time.Millisecond)
	defer cancelW()
	c2, cancel := context.WithTimeout(base, time.Second)
	defer cancel()
	var missing []int
	var we *rendezvous.WaitError
	if werr := st.Wait(cw, keys...); errors.As(werr, &we) {
		gone := map[string]bool{}
		for _, k := range we.Missing {
			gone[k] = true
		}
		for r, k := range keys {
			if gone[k] {
				missing = append(missing, r)
				continue
			}
			if b, gerr := st.Get(c2, k); gerr == nil {
				if cerr := check(r, b); cerr != nil {
					return cerr
				}
			}
		}
	}
	if len(missing) == 0 {
		return &tagged{msg: err.Error(), is: []error{ErrTimeout, err}}
	}
	mre := &rendezvous.MissingRanksError{Joined: len(keys) - len(missing), World: len(keys), After: waited, Missing: missing}
	return &tagged{msg: mre.Error(), is: []error{ErrTimeout, mre}}
}
