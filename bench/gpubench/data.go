package gpubench

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/numeric"
)

// PatternBytes is the block of benchmark inputs: a buffer is one random
// block of this many bytes repeated, so large inputs fill quickly and a
// result can be checked against a reference computed over one block. Block
// k is the first rotated left by k elements (see FillInput), so data moved
// by whole blocks (a wrong round offset) does not pass --check.
const PatternBytes = 4 << 20

// Seeds of the two rotating input buffers; --check verifies buffer 0.
const (
	seed0 = 1
	seed1 = 2
)

// pattern returns the first min(n, PatternBytes) bytes of rank's input for
// seed: numeric.Fill's values with every exact zero replaced by 1 (inputs
// are never zero), or, for the fp8 copy types, random bytes that are
// neither zero nor NaN/infinity. A shorter pattern is a prefix of a longer
// one, so every message size reads a prefix of the largest size's data.
// The result is shared (cached): callers must not modify it.
func pattern(dtype coll.DType, n int64, seed, rank int) []byte {
	if n > PatternBytes {
		n = PatternBytes
	}
	key := patternKey{dtype, n, seed, rank}
	if b, ok := patterns.Load(key); ok {
		return b.([]byte)
	}
	b := makePattern(dtype, n, seed, rank)
	patterns.Store(key, b)
	return b
}

type patternKey struct {
	dtype      coll.DType
	n          int64
	seed, rank int
}

// patterns caches pattern blocks: a sweep asks for the same few (sizes
// below PatternBytes add up to less than 2*PatternBytes per rank and seed).
var patterns sync.Map

func makePattern(dtype coll.DType, n int64, seed, rank int) []byte {
	b := make([]byte, n)
	if dtype.IsFloat8() {
		r := rand.New(rand.NewPCG(uint64(seed), uint64(rank)+1))
		for i := range b {
			v := byte(r.Uint32())
			if m := v & 0x7f; m == 0 || m >= 0x78 {
				v = v&0x80 | 0x38
			}
			b[i] = v
		}
		return b
	}
	numeric.Fill(dtype, b, seed, rank)
	es := dtype.Size()
	for i := 0; i < len(b)/es; i++ {
		if numeric.Get(dtype, b, i) == 0 {
			numeric.Put(dtype, b, i, 1)
		}
	}
	return b
}

// FillInput writes rank's benchmark input for seed into b: the pattern
// block repeated, repetition k rotated left by k elements (see
// PatternBytes). len(b) must be a multiple of the element size.
func FillInput(dtype coll.DType, b []byte, seed, rank int) {
	blk := pattern(dtype, int64(len(b)), seed, rank)
	es := int64(dtype.Size())
	for o := int64(0); o < int64(len(b)); {
		run := inputRun(blk, es, o, int64(len(b))-o)
		o += int64(copy(b[o:], run))
	}
}

// inputRun returns the input bytes FillInput writes from byte x on, as far
// as they lie contiguous in blk (the block, pattern's) and at most l bytes:
// at x in repetition k = x/len(blk) lies blk's byte (x + k*es) mod len(blk).
func inputRun(blk []byte, es, x, l int64) []byte {
	period := int64(len(blk))
	k, p := x/period, x%period
	q := (p + k%(period/es)*es) % period
	return blk[q : q+min(l, period-p, period-q)]
}

// Verify checks rank's output got of a collective whose every rank r had
// the input FillInput(dtype, in_r, seed, r) of sh.InBytes bytes, against a
// float64 host reference (numeric.Check's tolerance for float sums, exact
// for max, min and all-gather). Elements still holding the 0xff fill (NaN
// for float types) fail, so an output never written cannot pass. stepwise
// loosens float sums for libraries that round after every addition (NCCL,
// and auto, which hands large sizes to NCCL; generated kernels are held to
// the strict bound when forced).
func Verify(collective coll.Collective, dtype coll.DType, op coll.Op, world, rank int, sh Shape, seed int, got []byte, stepwise bool) error {
	if int64(len(got)) != sh.OutBytes {
		return fmt.Errorf("output is %d bytes, want %d", len(got), sh.OutBytes)
	}
	es := int64(dtype.Size())
	blocks := make([][]byte, world)
	for r := range blocks {
		blocks[r] = pattern(dtype, sh.InBytes, seed, r)
	}
	if collective == coll.AllGather {
		for o := int64(0); o < sh.OutBytes; {
			r, io := o/sh.InBytes, o%sh.InBytes
			want := inputRun(blocks[r], es, io, min(sh.OutBytes-o, sh.InBytes-io))
			l := int64(len(want))
			if !bytes.Equal(got[o:o+l], want) {
				i := int64(0)
				for got[o+i] == want[i] {
					i++
				}
				return fmt.Errorf("%s: element %d (from rank %d) has bytes %x, want %x",
					dtype, (o+i)/es, r, got[o+i-(o+i)%es:][:es], want[i-i%es:][:es])
			}
			o += l
		}
		return nil
	}
	// Output byte o is input byte base+o of every rank.
	base := int64(0)
	if collective == coll.ReduceScatter {
		base = int64(rank) * sh.OutBytes
	}
	srcs := make([][]byte, world)
	for o := int64(0); o < sh.OutBytes; {
		var l int64
		for r := range srcs {
			srcs[r] = inputRun(blocks[r], es, base+o, sh.OutBytes-o)
			l = int64(len(srcs[r])) // the same for every rank
		}
		win := got[o : o+l]
		for i := 0; i < int(l/es); i++ {
			if math.IsNaN(numeric.Get(dtype, win, i)) {
				return fmt.Errorf("%s %s: element %d is NaN (never written?)", dtype, op, o/es+int64(i))
			}
		}
		if err := numeric.CheckWith(dtype, op, win, srcs, stepwise); err != nil {
			return fmt.Errorf("%w (in the window starting at element %d)", err, o/es)
		}
		o += l
	}
	return nil
}
