package proof

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
)

// specials are the values whose combination TestSpecialValues checks, as
// bit patterns per element type: a quiet NaN, a negative NaN with another
// payload, +Inf, -Inf, -0, +0, 1 and -1.
var specials = map[coll.DType][]uint64{
	coll.F32:  {0x7fc00000, 0xffc00001, 0x7f800000, 0xff800000, 0x80000000, 0, 0x3f800000, 0xbf800000},
	coll.F64:  {0x7ff8000000000000, 0xfff8000000000001, 0x7ff0000000000000, 0xfff0000000000000, 1 << 63, 0, 0x3ff0000000000000, 0xbff0000000000000},
	coll.F16:  {0x7e00, 0xfe01, 0x7c00, 0xfc00, 0x8000, 0, 0x3c00, 0xbc00},
	coll.BF16: {0x7fc0, 0xffc1, 0x7f80, 0xff80, 0x8000, 0, 0x3f80, 0xbf80},
}

var specialNames = []string{"NaN", "-NaN'", "+Inf", "-Inf", "-0", "+0", "1", "-1"}

// specialStaging is TestSpecialValues' Config.StagingBytes: every forced
// push kernel's inbox holds specialCount (TestProofSizesFit checks).
const specialStaging = 16 << 20

// allComboWorlds is the largest world whose every combination of specials
// across the ranks TestSpecialValues runs: 8^4 = 4096 elements of them.
// World 8's would be 8^8, 16.7 million elements a rank (400 MB of f64).
const allComboWorlds = 4

// specialCombos is how many combinations of specials TestSpecialValues
// runs at world w: every one up to allComboWorlds; beyond, those with at
// most two distinct specials, every ordered pair (a, b) in each of the 2^W
// placements of b among the ranks (64 x 256 at world 8). They hold every
// case the semantics name: a NaN among numbers and where, all NaN with
// either payload, +Inf with -Inf, zeros of both signs in any rank order.
func specialCombos(w int) int {
	if w <= allComboWorlds {
		c := 1
		for range w {
			c *= len(specialNames)
		}
		return c
	}
	return len(specialNames) * len(specialNames) << w
}

// specialCount is the per-rank count TestSpecialValues gives collective at
// world w: every combination three times and a tail, so vector bodies and
// scalar tails both see them (reduce-scatter: over the ranks' blocks).
func specialCount(collective coll.Collective, w int) int {
	n := specialCombos(w)*3 + 5
	if collective == coll.ReduceScatter {
		n = n/w + 1
	}
	return n
}

// specialIndex is which special rank r contributes at element i: the
// elements run through specialCombos(w) combinations across the ranks,
// then repeat.
func specialIndex(i, r, w int) int {
	i %= specialCombos(w)
	if w > allComboWorlds { // pair (a, b), b on the ranks of mask
		pair, mask := i>>w, i&(1<<w-1)
		if mask>>r&1 == 1 {
			return pair % len(specialNames)
		}
		return pair / len(specialNames)
	}
	for range r {
		i /= len(specialNames)
	}
	return i % len(specialNames)
}

// specialInput is rank r's input of n elements of d.
func specialInput(d coll.DType, n, r, w int) []byte {
	size := d.Size()
	b := make([]byte, n*size)
	for i := range n {
		v := specials[d][specialIndex(i, r, w)]
		switch size {
		case 2:
			binary.LittleEndian.PutUint16(b[i*size:], uint16(v))
		case 4:
			binary.LittleEndian.PutUint32(b[i*size:], uint32(v))
		default:
			binary.LittleEndian.PutUint64(b[i*size:], v)
		}
	}
	return b
}

// TestSpecialValues checks that NaN, +/-Inf and -0.0 mean the same from
// every generated algorithm, from auto and from NCCL: for every reduce
// dtype and op, all-reduce and reduce-scatter over every combination of
// special values across the ranks give NCCL's result bit for bit. The
// semantics (docs/numerics.md): sum is IEEE addition in rank order (NaN
// in, canonical NaN out; +Inf + -Inf = NaN); max and min are maxNum and
// minNum (a NaN operand is ignored unless every operand is NaN).
//
// Ranks sharing one GPU ($COLLGEN_TEST_SHARE_GPU) have no NCCL: there the
// reference is the barrier one-shot (specialRef), which the runs with a
// GPU per rank hold to NCCL's bits, auto is left out (its rules name
// NCCL), and the NCCL table is not written; every other generated
// algorithm must still give the reference's bits.
func TestSpecialValues(t *testing.T) {
	ngpu := proofGPUs(t)
	ref := coll.NCCL
	if sharedGPU() {
		ref = specialRef
	}
	var report strings.Builder
	compared := 0 // algorithm runs held to the reference
	defer func() { t.Logf("%d algorithm runs compared with %s, worlds %v", compared, ref, worlds(ngpu)) }()
	for _, w := range worlds(ngpu) {
		comms := newComms(t, w, comm.Config{Library: collectives.Library, StagingBytes: specialStaging, Group: fmt.Sprintf("special-w%d", w)})
		for _, collective := range []coll.Collective{coll.AllReduce, coll.ReduceScatter} {
			for _, d := range []coll.DType{coll.F32, coll.F64, coll.F16, coll.BF16} {
				for _, op := range coll.Ops() {
					var algs []coll.Algorithm
					if ref == coll.NCCL {
						algs = append(algs, coll.Auto)
					}
					hasRef := ref == coll.NCCL
					for _, c := range collectives.Combinations {
						if c.World != w || c.Collective != collective || c.DType != d || c.Op != op {
							continue
						}
						if c.Algorithm == ref {
							hasRef = true
						} else if selected(c.Kernel) {
							algs = append(algs, c.Algorithm)
						}
					}
					if len(algs) == 0 || !hasRef {
						continue // nothing to compare, or no reference kernel (f64 on a GPU spec without it)
					}
					n := specialCount(collective, w)
					want, err := runSpecial(comms, collective, d, op, ref, n)
					if err != nil {
						t.Fatalf("w%d %s %s %s via %s: %v", w, collective, d, op, ref, err)
					}
					if w == 2 && collective == coll.AllReduce && ref == coll.NCCL {
						writeSemantics(&report, d, op, want[0])
					}
					for _, alg := range algs {
						compared++
						got, err := runSpecial(comms, collective, d, op, alg, n)
						if err != nil {
							t.Errorf("w%d %s %s %s %s: %v", w, collective, d, op, alg, err)
							continue
						}
						for r := range got {
							if e := firstDiff(got[r], want[r], d, r, w, n, collective); e != "" {
								t.Errorf("w%d %s %s %s %s rank %d differs from %s: %s", w, collective, d, op, alg, r, ref, e)
								break
							}
						}
					}
				}
			}
		}
		if err := closeComms(comms); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	if p := os.Getenv("SPECIAL_TABLE"); p != "" && ref == coll.NCCL {
		os.WriteFile(p, []byte(report.String()), 0o644)
	}
}

// specialRef is TestSpecialValues' reference where ranks share a GPU (no
// NCCL): the barrier one-shot, held to NCCL's bits where NCCL runs.
const specialRef = coll.OneShot

// runSpecial runs one collective with algorithm alg on every rank and
// returns every rank's output.
func runSpecial(comms []*comm.Communicator, collective coll.Collective, d coll.DType, op coll.Op, alg coll.Algorithm, n int) ([][]byte, error) {
	w := len(comms)
	outs := make([][]byte, w)
	errs := make([]error, w)
	var wg sync.WaitGroup
	for r, cm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[r], errs[r] = runSpecialRank(cm, collective, d, op, alg, n, r, w)
		}()
	}
	wg.Wait()
	return outs, errors.Join(errs...)
}

func runSpecialRank(cm *comm.Communicator, collective coll.Collective, d coll.DType, op coll.Op, alg coll.Algorithm, n, r, w int) ([]byte, error) {
	dev := cm.Device()
	inN, outN := n, n
	if collective == coll.ReduceScatter {
		inN = n * w
	}
	in, err := dev.Alloc(inN * d.Size())
	if err != nil {
		return nil, err
	}
	defer dev.Free(in)
	out, err := dev.Alloc(outN * d.Size())
	if err != nil {
		return nil, err
	}
	defer dev.Free(out)
	if err := dev.CopyHtoD(in, specialInput(d, inN, r, w)); err != nil {
		return nil, err
	}
	if err := dev.Memset8(out, poison, outN*d.Size()); err != nil {
		return nil, err
	}
	o := comm.Options{Algorithm: alg}
	if collective == coll.AllReduce {
		err = cm.AllReduce(comm.DeviceBuffer(in), comm.DeviceBuffer(out), n, d, op, o)
	} else {
		err = cm.ReduceScatter(comm.DeviceBuffer(in), comm.DeviceBuffer(out), n, d, op, o)
	}
	if err == nil {
		err = cm.Synchronize(nil)
	}
	if err != nil {
		return nil, err
	}
	got := make([]byte, outN*d.Size())
	return got, dev.CopyDtoH(got, out)
}

// firstDiff describes the first element where got and want differ, with
// the inputs that produced it, or returns "".
func firstDiff(got, want []byte, d coll.DType, rank, w, n int, collective coll.Collective) string {
	size := d.Size()
	for i := 0; i < len(got); i += size {
		if string(got[i:i+size]) != string(want[i:i+size]) {
			e := i / size
			if collective == coll.ReduceScatter {
				e += rank * n
			}
			var ins []string
			for r := range w {
				ins = append(ins, specialNames[specialIndex(e, r, w)])
			}
			return fmt.Sprintf("element %d (inputs %s): got %#x, NCCL %#x", i/size, strings.Join(ins, ", "), bitsOf(got[i:i+size]), bitsOf(want[i:i+size]))
		}
	}
	return ""
}

// writeSemantics appends NCCL's world-2 results of d and op for every pair
// of specials (the table docs/numerics.md shows).
func writeSemantics(b *strings.Builder, d coll.DType, op coll.Op, out []byte) {
	size := d.Size()
	fmt.Fprintf(b, "\n%s %s (rank 0 \\ rank 1): bits of the result\n\n| |%s|\n|---|%s\n", d, op, strings.Join(specialNames, "|"), strings.Repeat("---|", len(specialNames)))
	for a := range specialNames {
		fmt.Fprintf(b, "| %s |", specialNames[a])
		for c := range specialNames {
			e := a + c*len(specialNames)
			fmt.Fprintf(b, " %#x |", bitsOf(out[e*size:(e+1)*size]))
		}
		b.WriteString("\n")
	}
}

// bitsOf reads one little-endian element as an integer.
func bitsOf(b []byte) uint64 {
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}
