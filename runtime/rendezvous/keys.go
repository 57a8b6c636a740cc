package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// ErrInvalidArgument is wrapped by DeleteKeys, Counters, Join, Barrier,
// AllGather, ForgetAllGather and ForgetBarrier when they are given no
// store, and by the Forget functions given a world size below 1 or above
// MaxWorldSize.
var ErrInvalidArgument = errors.New("rendezvous: invalid argument")

// KeysInFlight is how many store operations DeleteKeys and Counters keep
// in flight at once: a group's keys go in a few round trips instead of
// one per key (on etcd at world 64, hundreds), without flooding the
// store's server with connections.
const KeysInFlight = 16

// DeleteKeys deletes keys from s, up to KeysInFlight at once, and
// returns once every Delete it started has returned. A key already gone
// is not an error. Every key is tried unless ctx ends first (keys not yet
// started then count as failed with ctx's error). The error names the
// first key, in the order given, that was not deleted, wraps that key's
// error and says how many others were not deleted. A nil store is an
// error wrapping ErrInvalidArgument.
func DeleteKeys(ctx context.Context, s Store, keys ...string) error {
	if s == nil {
		return fmt.Errorf("%w: DeleteKeys: the store is nil", ErrInvalidArgument)
	}
	errs := each(ctx, len(keys), func(i int) error {
		_, err := s.Delete(ctx, keys[i])
		return err
	})
	return keysErr("delete", keys, errs)
}

// Counters reads the integer counters at keys, up to KeysInFlight at
// once, with Add of 0: a missing counter reads 0 and is created, as Add
// creates it (callers that forget a counter delete it afterwards). A
// counter that could not be read reads 0; the error is DeleteKeys's, for
// the reads. A nil store is an error wrapping ErrInvalidArgument.
func Counters(ctx context.Context, s Store, keys ...string) ([]int64, error) {
	if s == nil {
		return make([]int64, len(keys)), fmt.Errorf("%w: Counters: the store is nil", ErrInvalidArgument)
	}
	out := make([]int64, len(keys))
	errs := each(ctx, len(keys), func(i int) error {
		n, err := s.Add(ctx, keys[i], 0)
		if err == nil {
			out[i] = n
		}
		return err
	})
	return out, keysErr("read counter", keys, errs)
}

// each runs fn(0) … fn(n-1), at most KeysInFlight at once, and returns
// their errors by index once every call it started has returned. Once ctx
// ends it starts no more: those not started get ctx's error.
func each(ctx context.Context, n int, fn func(i int) error) []error {
	errs := make([]error, n)
	if n == 1 && ctx.Err() == nil {
		errs[0] = fn(0)
		return errs
	}
	sem := make(chan struct{}, KeysInFlight)
	var wg sync.WaitGroup
	for i := range n {
		if ctx.Err() == nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			for j := i; j < n; j++ {
				errs[j] = CauseErr(ctx)
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i)
			<-sem
		}()
	}
	wg.Wait()
	return errs
}

// keysErr is nil when no key failed, else the first failed key's error
// (wrapped, naming the key unless the store's error already does) and a
// count of the others.
func keysErr(what string, keys []string, errs []error) error {
	first, failed := -1, 0
	for i, err := range errs {
		if err != nil {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if first < 0 {
		return nil
	}
	k, err := strconv.Quote(keys[first]), errs[first]
	if !strings.Contains(err.Error(), k) {
		err = fmt.Errorf("rendezvous: %s %s: %w", what, k, err)
	}
	if failed > 1 {
		err = fmt.Errorf("%w (and %d more of %d keys failed)", err, failed-1, len(keys))
	}
	return err
}
