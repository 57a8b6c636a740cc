// Package hostbench times the host backend's collectives on one rank of a
// group; every rank runs the same sweep in the same order, and rank 0 gets
// the results (the slowest rank's time per iteration, median over
// iterations).
package hostbench

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/host"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/schedule"
)

// Options is the sweep.
type Options struct {
	Collectives []coll.Collective // swept in this order
	Algorithms  []coll.Algorithm  // empty: the group's automatic choice per size
	DTypes      []coll.DType      // element types, swept in this order
	Ops         []coll.Op         // ignored for all-gather
	Sizes       []int64           // message sizes in bytes (the larger of input and output)
	Iters       int               // timed iterations per case; 0 picks by time (about 0.25 s per case, 5..2000)
	Check       bool              // verify every case's result against a float64 reference first
}

// Case is one configuration of the sweep.
type Case struct {
	Collective coll.Collective // what is called
	Algorithm  coll.Algorithm  // coll.Auto: the group's choice
	DType      coll.DType      // element type
	Op         coll.Op         // reduce op; empty for all-gather
	Bytes      int64           // message size in bytes: the larger of input and output
}

// Label describes the case for progress lines and errors.
func (c Case) Label() string {
	return fmt.Sprintf("%s %s %s %s %s", c.Collective, c.Algorithm, c.DType, c.Op, bench.FormatBytes(c.Bytes))
}

// Cases enumerates the sweep for a world size, skipping algorithms that do
// not exist for a collective or world or that the host backend cannot run
// (LL schedules push into peers' memory), and sizes below one element per
// rank.
func Cases(o Options, world int) []Case {
	var out []Case
	for _, c := range o.Collectives {
		algs := o.Algorithms
		if len(algs) == 0 {
			algs = []coll.Algorithm{coll.Auto}
		}
		for _, alg := range algs {
			if hostCannotRun(c, alg, world) != nil {
				continue
			}
			for _, dt := range o.DTypes {
				ops := o.Ops
				if !c.Reduces() {
					ops = []coll.Op{""}
				}
				for _, op := range ops {
					for _, b := range o.Sizes {
						if _, ok := bench.ShapeFor(c, dt, b, world); !ok {
							continue
						}
						out = append(out, Case{c, alg, dt, op, b})
					}
				}
			}
		}
	}
	return out
}

// Plan is Cases with what it leaves out said: notes name each requested
// algorithm a collective cannot run on the host at this world size (with
// the reason) and each size below one element per rank. A sweep that
// leaves nothing is an error carrying those notes.
func Plan(o Options, world int) (cases []Case, notes []string, err error) {
	cases = Cases(o, world)
	for _, c := range o.Collectives {
		for _, alg := range o.Algorithms {
			if err := hostCannotRun(c, alg, world); err != nil {
				notes = append(notes, fmt.Sprintf("%s left out of the %s sweep: %v", alg, c, err))
			}
		}
	}
	for _, b := range o.Sizes {
		fits := false
		for _, c := range o.Collectives {
			for _, dt := range o.DTypes {
				if _, ok := bench.ShapeFor(c, dt, b, world); ok {
					fits = true
				}
			}
		}
		if !fits {
			notes = append(notes, fmt.Sprintf("size %d B left out: below one element (per rank, for reduce-scatter and all-gather) of every --dtype at world %d", b, world))
		}
	}
	if len(cases) == 0 {
		why := "no case of --collective, --algorithms, --dtype and --sizes remains"
		if len(notes) > 0 {
			why = strings.Join(notes, "; ")
		}
		return nil, notes, fmt.Errorf("the sweep is empty at world %d: %s", world, why)
	}
	return cases, notes, nil
}

// Bytes returns what one rank allocates for the sweep: the input and
// output buffers Run sizes for the largest case, and with Check the
// reference inputs of every rank that check regenerates. It saturates at
// math.MaxInt64: sizes near 2^63 must not wrap round to a figure a memory
// check lets through.
func Bytes(o Options, cases []Case, world int) int64 {
	maxIn, maxOut := buffers(cases, world)
	n := satAdd(int64(maxIn), int64(maxOut))
	if o.Check {
		n = satAdd(n, satMul(int64(world), int64(maxIn)))
	}
	return n
}

// satAdd and satMul add and multiply non-negative sizes, saturating at
// math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// hostCannotRun says why the host backend cannot run alg for collective c
// at world size world (no such schedule, or one that writes into peers'
// memory), or nil; Auto it always can.
func hostCannotRun(c coll.Collective, alg coll.Algorithm, world int) error {
	if alg == coll.Auto {
		return nil
	}
	s, err := schedule.Build(c, alg, world)
	if err != nil {
		return err
	}
	return schedule.HostCanRun(s)
}

// buffers returns the largest input and output of cases, which Run
// allocates once for the whole sweep.
func buffers(cases []Case, world int) (maxIn, maxOut int) {
	for _, c := range cases {
		_, in, out := counts(c, world)
		maxIn, maxOut = max(maxIn, in), max(maxOut, out)
	}
	return maxIn, maxOut
}

// counts returns the element count argument and the buffer sizes of a case.
func counts(c Case, world int) (count, inBytes, outBytes int) {
	sh, _ := bench.ShapeFor(c.Collective, c.DType, c.Bytes, world)
	return sh.Count, int(sh.InBytes), int(sh.OutBytes)
}

// Run runs every case on g and returns the results (identical on every
// rank). progress, if non-nil, is called after each case.
func Run(ctx context.Context, g *host.Group, o Options, progress func(done int, label string)) ([]bench.Result, error) {
	w := g.WorldSize()
	cases := Cases(o, w)
	if len(cases) == 0 {
		return nil, fmt.Errorf("bench: the sweep is empty (check --collective, --algorithms, --dtype and --sizes for world %d)", w)
	}
	if err := g.Setup(ctx); err != nil {
		return nil, err
	}
	maxIn, maxOut := buffers(cases, w)
	inBuf, outBuf := alignedBytes(maxIn), alignedBytes(maxOut)
	// Collect now rather than under the first timed case (the buffers
	// above can start a collection whose workers would compete with the
	// ranks for CPUs).
	runtime.GC()
	var results []bench.Result
	for i, c := range cases {
		warm := warmFor
		if i == 0 {
			warm = firstWarmFor
		}
		r, err := runCase(ctx, g, o, c, inBuf, outBuf, warm)
		if err != nil {
			return nil, fmt.Errorf("bench %s: %w", c.Label(), err)
		}
		results = append(results, r)
		if progress != nil {
			progress(i+1, c.Label())
		}
	}
	return results, nil
}

// alignedBytes returns n zeroed bytes starting on a 64-byte boundary.
func alignedBytes(n int) []byte {
	b := make([]byte, n+64)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(b))) & 63)
	return b[off : off+n]
}

// call runs one collective of a case: do (a test replaces it).
var call = do

func do(ctx context.Context, g *host.Group, c Case, in, out []byte, count int) error {
	opts := host.Options{Algorithm: c.Algorithm}
	switch c.Collective {
	case coll.AllReduce:
		return g.AllReduce(ctx, in, out, count, c.DType, c.Op, opts)
	case coll.ReduceScatter:
		return g.ReduceScatter(ctx, in, out, count, c.DType, c.Op, opts)
	case coll.AllGather:
		return g.AllGather(ctx, in, out, count, c.DType, opts)
	}
	return fmt.Errorf("unknown collective %q", c.Collective)
}

// warmUp runs rounds of 3, 6, 12, ... iterations (round(n) runs n and
// returns the slowest rank's seconds per iteration and time since the
// warm-up began) until at least two rounds have run and warmup has
// passed, and returns the last round's time per iteration, which sizes the
// timed run. The first round takes the first touches of a size's new
// buffers (page faults): alone it sized 2-16 MiB runs to 7-35 iterations
// instead of a quarter second's worth.
func warmUp(warmup time.Duration, round func(n int) (per, elapsed float64, err error)) (float64, error) {
	for n, rounds := 3, 1; ; n, rounds = min(2*n, 1<<16), rounds+1 {
		per, elapsed, err := round(n)
		if err != nil {
			return 0, err
		}
		if rounds >= 2 && elapsed >= warmup.Seconds() {
			return math.Max(per, 1e-9), nil
		}
	}
}

// maxAll returns the elementwise maximum of xs over every rank.
func maxAll(ctx context.Context, g *host.Group, xs []float64) ([]float64, error) {
	b := make([]byte, 8*len(xs))
	for i, x := range xs {
		numeric.Put(coll.F64, b, i, x)
	}
	if err := g.AllReduce(ctx, b, b, len(xs), "f64", "max", host.Options{}); err != nil {
		return nil, err
	}
	out := make([]float64, len(xs))
	for i := range out {
		out[i] = numeric.Get(coll.F64, b, i)
	}
	return out, nil
}

// Warm-up before a case's timed iterations: at least this long. The first
// case of a run gets longer: right after the ranks start, the kernel has
// not yet spread their threads over the CPUs, and a rank spinning beside
// the peer it waits for on one CPU made a whole first case 10x slower
// (world 8 at 4 KiB on the 32-core GPU host, 2 of 5 sweeps;
// docs/host-backend.md).
const (
	warmFor      = 20 * time.Millisecond
	firstWarmFor = 300 * time.Millisecond
)

func runCase(ctx context.Context, g *host.Group, o Options, c Case, inBuf, outBuf []byte, warmup time.Duration) (bench.Result, error) {
	w, rank := g.WorldSize(), g.Rank()
	count, inB, outB := counts(c, w)
	in, out := inBuf[:inB], outBuf[:outB]
	numeric.Fill(c.DType, in, int(c.Bytes), rank)
	var picked coll.Algorithm // an auto row's choice: its row stays "auto", apart from a forced row of that algorithm
	if c.Algorithm == coll.Auto {
		a, err := g.Algorithm(c.Collective, c.Bytes)
		if err != nil {
			return bench.Result{}, err
		}
		picked = a
	}
	if o.Check {
		// The output is shared by every case and may hold this case's
		// answer already (another algorithm's run of it): 0xff bytes (NaN
		// for float types) make an output the collective leaves unwritten
		// fail, as the GPU bench's check does.
		for i := range out {
			out[i] = 0xff
		}
		if err := call(ctx, g, c, in, out, count); err != nil {
			return bench.Result{}, err
		}
		if err := check(c, w, rank, count, out); err != nil {
			return bench.Result{}, fmt.Errorf("wrong result: %w", err)
		}
	}
	// Every rank decides from the same maxima, so all run the same numbers.
	start := time.Now()
	perS, err := warmUp(warmup, func(n int) (float64, float64, error) {
		t0 := time.Now()
		for i := 0; i < n; i++ {
			if err := call(ctx, g, c, in, out, count); err != nil {
				return 0, 0, err
			}
		}
		m, err := maxAll(ctx, g, []float64{time.Since(t0).Seconds() / float64(n), time.Since(start).Seconds()})
		if err != nil {
			return 0, 0, err
		}
		return m[0], m[1], nil
	})
	if err != nil {
		return bench.Result{}, err
	}
	iters := o.Iters
	if iters <= 0 {
		iters = int(math.Min(2000, math.Max(5, 0.25/perS)))
	}
	us := make([]float64, iters, iters+3)
	w0 := g.WaitStats()
	for i := range us {
		t0 := time.Now()
		if err := call(ctx, g, c, in, out, count); err != nil {
			return bench.Result{}, err
		}
		us[i] = float64(time.Since(t0).Nanoseconds()) / 1e3
	}
	w1 := g.WaitStats()
	// The slowest rank's time per iteration, and the most late waits per
	// call of any rank, in one reduction.
	per := func(a, b uint64) float64 { return float64(b-a) / float64(iters) }
	all, err := maxAll(ctx, g, append(us, per(w0.Spun, w1.Spun), per(w0.Yielded, w1.Yielded), per(w0.Blocked, w1.Blocked)))
	if err != nil {
		return bench.Result{}, err
	}
	us, waits := all[:iters], all[iters:]
	med := bench.Median(us)
	// The bytes moved: the size rounded down to whole elements (per rank,
	// for reduce-scatter and all-gather), as the GPU bench reports.
	sh, _ := bench.ShapeFor(c.Collective, c.DType, c.Bytes, w)
	return bench.Result{Backend: "host", Collective: string(c.Collective), Algorithm: c.Algorithm.String(), Picked: string(picked), DType: string(c.DType), Op: string(c.Op), World: w,
		Bytes: sh.Bytes, Iters: iters, MedianUS: med, BusGBps: bench.BusBandwidth(c.Collective, sh.Bytes, w, med),
		LateWaits: &bench.LateWaits{Spun: waits[0], Yielded: waits[1], Blocked: waits[2]}}, nil
}

// check verifies out against every rank's regenerated input.
func check(c Case, w, rank, count int, out []byte) error {
	esz := c.DType.Size()
	_, inB, _ := counts(c, w)
	inputs := make([][]byte, w)
	for r := range inputs {
		inputs[r] = make([]byte, inB)
		numeric.Fill(c.DType, inputs[r], int(c.Bytes), r)
	}
	switch c.Collective {
	case coll.AllReduce:
		return numeric.Check(c.DType, c.Op, out, inputs)
	case coll.ReduceScatter:
		for r := range inputs {
			inputs[r] = inputs[r][rank*count*esz : (rank+1)*count*esz]
		}
		return numeric.Check(c.DType, c.Op, out, inputs)
	}
	for r := range inputs {
		if string(out[r*count*esz:(r+1)*count*esz]) != string(inputs[r]) {
			return fmt.Errorf("all-gather block %d differs from rank %d's input", r, r)
		}
	}
	return nil
}

// MemcpyGBps measures copy bandwidth of a bytes-sized buffer with threads
// goroutines each copying its share, best of several rounds, in GB/s of
// bytes copied (read once, written once).
func MemcpyGBps(bytes, threads int) float64 {
	src, dst := alignedBytes(bytes), alignedBytes(bytes)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault every page in
	best := math.Inf(1)
	for round := 0; round < 5; round++ {
		done := make(chan struct{}, threads)
		t0 := time.Now()
		for t := 0; t < threads; t++ {
			lo, hi := bytes*t/threads, bytes*(t+1)/threads
			go func() { copy(dst[lo:hi], src[lo:hi]); done <- struct{}{} }()
		}
		for t := 0; t < threads; t++ {
			<-done
		}
		best = math.Min(best, time.Since(t0).Seconds())
	}
	return float64(bytes) / best / 1e9
}
