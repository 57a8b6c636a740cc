package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// testLibrary is the Library the tests run with: the generated one, whose
// reduce loops and host_shm rules production uses. (TestPortableLibrary
// covers PortableLibrary.)
var testLibrary = collectives.Library

// op is one collective in a test sweep.
type op struct {
	coll    coll.Collective
	alg     coll.Algorithm
	dtype   coll.DType
	red     coll.Op
	count   int // allreduce: elements; RS: per-rank output; AG: per-rank input
	inPlace bool
	offset  int // buffers start this many elements past a 64-byte boundary
	tag     uint64
	seed    int
}

func (o op) String() string {
	ip := ""
	if o.inPlace {
		ip = " in-place"
	}
	return fmt.Sprintf("%s %s %s %s n=%d offset=%d%s", o.coll, o.alg, o.dtype, o.red, o.count, o.offset, ip)
}

// Every buffer runOp hands a collective has guardBytes of guardByte on
// both sides (nccl-tests' guard check): a write past either end of a
// buffer is an error, as is a change to an out-of-place input.
const (
	guardBytes = 64
	guardByte  = 0xa5
)

// guarded is a buffer b inside whole, starting lo bytes in, with guard
// bytes before and after it. b's capacity ends with it.
type guarded struct {
	whole, b []byte
	lo       int
}

// newGuarded returns a guarded buffer of n bytes that starts off bytes
// past a 64-byte boundary (the backend's vector loops peel a head up to
// one).
func newGuarded(n, off int) guarded {
	raw := bytes.Repeat([]byte{guardByte}, 64+guardBytes+off+n+guardBytes)
	skip := int(-uintptr(unsafe.Pointer(unsafe.SliceData(raw))) & 63)
	whole := raw[skip : skip+guardBytes+off+n+guardBytes]
	lo := guardBytes + off
	return guarded{whole: whole, b: whole[lo : lo+n : lo+n], lo: lo}
}

// intact returns an error naming the first guard byte overwritten.
func (g guarded) intact(what string) error {
	for i, c := range g.whole {
		if (i < g.lo || i >= g.lo+len(g.b)) && c != guardByte {
			return fmt.Errorf("%s of %d bytes: the guard byte at offset %d overwritten (%#x)", what, len(g.b), i-g.lo, c)
		}
	}
	return nil
}

// runOp runs o on g with deterministic inputs and checks the result
// against a float64 (or exact) reference computed from every rank's
// regenerated input. It returns the output for cross-rank comparison.
func runOp(ctx context.Context, g *Group, o op) ([]byte, error) {
	w, rank, esz := g.WorldSize(), g.Rank(), o.dtype.Size()
	inE, outE := o.count, o.count
	switch o.coll {
	case coll.ReduceScatter:
		inE = w * o.count
	case coll.AllGather:
		outE = w * o.count
	}
	inputs := inputsFor(o.dtype, inE, o.seed, w)
	defer releaseInputs(o.dtype, inE, o.seed, w)
	off := o.offset * esz
	inG, outG := newGuarded(inE*esz, off), newGuarded(outE*esz, off)
	in, out := inG.b, outG.b
	copy(in, inputs[rank])
	if o.inPlace {
		switch o.coll {
		case coll.AllReduce:
			out, outG = in, inG
		case coll.ReduceScatter:
			out, outG = in[rank*o.count*esz:(rank+1)*o.count*esz], inG
		case coll.AllGather:
			copy(out[rank*o.count*esz:], in)
			in, inG = out[rank*o.count*esz:(rank+1)*o.count*esz], outG
		}
	}
	opts := Options{Algorithm: o.alg, Tag: o.tag}
	var err error
	switch o.coll {
	case coll.AllReduce:
		err = g.AllReduce(ctx, in, out, o.count, o.dtype, o.red, opts)
	case coll.ReduceScatter:
		err = g.ReduceScatter(ctx, in, out, o.count, o.dtype, o.red, opts)
	case coll.AllGather:
		err = g.AllGather(ctx, in, out, o.count, o.dtype, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("%v: %w", o, err)
	}
	for _, e := range []error{inG.intact("input"), outG.intact("output")} {
		if e != nil {
			return nil, fmt.Errorf("rank %d %v: %w", rank, o, e)
		}
	}
	if !o.inPlace && !bytes.Equal(in, inputs[rank]) {
		return nil, fmt.Errorf("rank %d %v: the input changed", rank, o)
	}
	switch o.coll {
	case coll.AllReduce:
		// Ranks' results are compared bitwise elsewhere; checking a few
		// against the reference keeps big worlds fast.
		if rank == 0 || rank == w-1 || rank%8 == 1 || !sharedInputs {
			err = numeric.Check(o.dtype, o.red, out, inputs)
		}
	case coll.ReduceScatter:
		srcs := make([][]byte, w)
		for r := range srcs {
			srcs[r] = inputs[r][rank*o.count*esz : (rank+1)*o.count*esz]
		}
		err = numeric.Check(o.dtype, o.red, out, srcs)
	case coll.AllGather:
		for r := 0; r < w; r++ {
			if !bytes.Equal(out[r*o.count*esz:(r+1)*o.count*esz], inputs[r]) {
				err = fmt.Errorf("block %d differs from rank %d's input", r, r)
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("rank %d %v: %w", rank, o, err)
	}
	return out, nil
}

// sweep returns every dtype x op x algorithm of the host spec at counts,
// in and out of place (alternately) and with buffers 0 to 3 elements past
// a 64-byte boundary (in turn, apart from that), so every combination of
// the two comes up for every collective.
func sweep(counts []int, w int) []op {
	var ops []op
	seed := 1
	add := func(o op) {
		o.inPlace, o.offset, o.seed = seed%2 == 0, (seed/2)%4, seed
		ops = append(ops, o)
		seed++
	}
	for _, dt := range numeric.DTypes {
		for _, c := range counts {
			for _, red := range coll.Ops() {
				for _, alg := range []coll.Algorithm{coll.OneShot, coll.TwoShot} {
					add(op{coll: coll.AllReduce, alg: alg, dtype: dt, red: red, count: c})
				}
				add(op{coll: coll.ReduceScatter, alg: coll.OneShot, dtype: dt, red: red, count: max(c/w, 1)})
			}
			add(op{coll: coll.AllGather, alg: coll.OneShot, dtype: dt, count: max(c/w, 1)})
		}
	}
	return ops
}

// goroutineGroup runs fn on world goroutine ranks of a fresh group and
// returns every rank's error, after closing the groups.
func goroutineGroup(t *testing.T, world int, cfg Config, fn func(g *Group) error) []error {
	t.Helper()
	st := cfg.Store
	if st == nil {
		st = rendezvous.NewMemStore()
		defer st.Close()
	}
	if cfg.Group == "" {
		cfg.Group = t.Name()
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 20 * time.Second
	}
	if cfg.Library == nil {
		cfg.Library = testLibrary
	}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg
			c.Rank, c.WorldSize, c.Store = r, world, st
			g, err := New(context.Background(), c)
			if err != nil {
				errs[r] = err
				return
			}
			errs[r] = fn(g)
			if err := g.Close(); err != nil && errs[r] == nil {
				errs[r] = err
			}
		}()
	}
	wg.Wait()
	return errs
}

// runOps runs ops in order on world goroutine ranks of a fresh group
// (goroutineGroup), each checked against the reference by runOp, and fails
// t with the first error.
func runOps(t *testing.T, world int, cfg Config, ops []op) {
	t.Helper()
	errs := goroutineGroup(t, world, cfg, func(g *Group) error {
		for _, o := range ops {
			if _, err := runOp(context.Background(), g, o); err != nil {
				return err
			}
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// sameOnEveryRank fails t unless every rank's i-th all-reduce result
// (outs[rank][i]) is bitwise rank 0's.
func sameOnEveryRank(t *testing.T, outs [][][]byte) {
	t.Helper()
	for r := 1; r < len(outs); r++ {
		for i := range outs[0] {
			if !bytes.Equal(outs[0][i], outs[r][i]) {
				t.Fatalf("all-reduce %d: rank %d's result differs from rank 0's", i, r)
			}
		}
	}
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

var _ = kernels.HostKey{}

// nopStore is a Store for tests that never set up shared memory.
type nopStore struct{}

func (nopStore) Set(context.Context, string, []byte) error         { return errors.New("nop store") }
func (nopStore) Get(context.Context, string) ([]byte, error)       { return nil, errors.New("nop store") }
func (nopStore) Wait(context.Context, ...string) error             { return errors.New("nop store") }
func (nopStore) Add(context.Context, string, int64) (int64, error) { return 0, errors.New("nop store") }
func (nopStore) CompareAndSet(context.Context, string, []byte, []byte) ([]byte, bool, error) {
	return nil, false, errors.New("nop store")
}
func (nopStore) Delete(context.Context, string) (bool, error) { return false, errors.New("nop store") }
func (nopStore) Close() error                                 { return nil }

// countSetups installs a test hook counting set-ups (all ranks) until the
// test ends, and returns the counter.
func countSetups(t *testing.T) func() int {
	var mu sync.Mutex
	n := 0
	testHook = func(rank int, point string) {
		if point == "setup:start" {
			mu.Lock()
			n++
			mu.Unlock()
		}
	}
	t.Cleanup(func() { testHook = nil })
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// sharedInputs says ranks are goroutines of this process, so inputsFor may
// share one set of regenerated inputs between them.
var sharedInputs = true

type inputKey struct {
	dtype          coll.DType
	n, seed, world int
}

var inputCache = struct {
	sync.Mutex
	m    map[inputKey][][]byte
	refs map[inputKey]int
}{m: map[inputKey][][]byte{}, refs: map[inputKey]int{}}

// inputsFor returns every rank's deterministic input for an op; goroutine
// ranks share one copy (generating W inputs on each of W ranks is what
// made big worlds slow), released by the last releaseInputs.
func inputsFor(dtype coll.DType, n, seed, w int) [][]byte {
	gen := func() [][]byte {
		in := make([][]byte, w)
		for r := range in {
			in[r] = make([]byte, n*dtype.Size())
			numeric.Fill(dtype, in[r], seed, r)
		}
		return in
	}
	if !sharedInputs {
		return gen()
	}
	k := inputKey{dtype, n, seed, w}
	inputCache.Lock()
	defer inputCache.Unlock()
	in, ok := inputCache.m[k]
	if !ok {
		in = gen()
		inputCache.m[k] = in
	}
	return in
}

func releaseInputs(dtype coll.DType, n, seed, w int) {
	if !sharedInputs {
		return
	}
	k := inputKey{dtype, n, seed, w}
	inputCache.Lock()
	defer inputCache.Unlock()
	// Every rank acquires before the collective's first barrier and
	// releases after its last, so the w-th release is the last use.
	if inputCache.refs[k]++; inputCache.refs[k] == w {
		delete(inputCache.m, k)
		delete(inputCache.refs, k)
	}
}

func numGoroutines() int { return runtime.NumGoroutine() }

// planOf returns the plan g makes for a collective of count elements
// (per-rank counts for reduce-scatter and all-gather), as run would.
func planOf(g *Group, c coll.Collective, alg coll.Algorithm, count int, dtype coll.DType) (*exec, error) {
	s, err := g.schedule(c, alg)
	if err != nil {
		return nil, err
	}
	x := &exec{g: g, s: s, esz: dtype.Size(), c: call{collective: c, count: count, dtype: dtype}}
	x.plan()
	return x, nil
}
