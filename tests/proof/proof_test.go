// Package proof proves every generated GPU kernel combination on real GPUs:
// random inputs with a fixed seed against a float64 host reference, counts
// of 1, small odd numbers, a power of two minus one, counts not divisible by
// the world size and tens of megabytes, poisoned outputs with guard regions
// before and after, in place and out of place, input and output pointers
// one element off alignment, goroutine-per-GPU and process-per-GPU, and
// CUDA graph capture and replay. It skips without GPUs. tests/proof/run.sh runs
// it on the GPU machine and writes a summary table.
package proof

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/symm"
)

// guard is the poisoned margin before and after every output.
const guard = 4096

const poison = 0xA7

// stagingBytes lets forced algorithms run the large counts (LL kernels
// need 2W times the message in inbox lines: 256 MiB for 32 MiB at world 4).
const stagingBytes = 320 << 20

// gpus returns the number of visible GPUs, or skips below 2.
func gpus(t *testing.T) int {
	t.Helper()
	return atLeast(t, 2)
}

// atLeast returns the number of visible GPUs, or skips below min.
func atLeast(t *testing.T, min int) int {
	t.Helper()
	if err := cuda.Init(); err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	n, err := cuda.DeviceCount()
	if err != nil || n < min {
		t.Skipf("need at least %d GPUs (have %d, %v)", min, n, err)
	}
	return n
}

// sharedGPU reports whether $COLLGEN_TEST_SHARE_GPU=1 (cudatest.Shared)
// puts every rank on GPU 0, so one GPU proves any world (run.sh sets it
// where there is one GPU): the kernels' logic and the runtime's paths
// (peer pointers, CUDA IPC, VMM, graphs, timeouts, aborts) at every count
// and layout; not NVLink's ordering or speed. NCCL refuses two ranks on
// one GPU, so the tests of NCCL groups (registration, windows,
// multi-host) still need a GPU per rank and skip; the special values
// compare with a generated reference instead (TestSpecialValues).
func sharedGPU() bool { return cudatest.Shared() }

// proofGPUs is gpus for the tests that run shared: with
// $COLLGEN_TEST_SHARE_GPU and a GPU, 8 (the largest world worlds proves).
func proofGPUs(t *testing.T) int {
	t.Helper()
	if !sharedGPU() {
		return gpus(t)
	}
	atLeast(t, 1)
	return 8
}

// place puts rank r on its GPU: GPU r, or with $COLLGEN_TEST_SHARE_GPU
// GPU 0 (New then caps each rank's grids at the SMs over the ranks on the
// GPU, so that all their blocks are resident at once: Config.MaxBlocks).
func place(cfg *comm.Config, r int) {
	cfg.Device = r
	if sharedGPU() {
		cfg.Device = 0
	}
}

// counts returns the element counts to prove: per-rank counts for
// reduce-scatter and all-gather, total counts for all-reduce. The large
// count comes last. Odd counts make every rank's block and chunk boundary
// fall off the kernels' vector boundaries.
func counts(collective coll.Collective, w int, large bool) []int {
	var cs []int
	if collective == coll.AllReduce {
		cs = []int{1, 7, 33, 1000*w + 3, 65535, 65537}
		if large {
			cs = append(cs, 8<<20+5)
		}
	} else {
		cs = []int{1, 7, 1001, 16383, 16384}
		if large {
			cs = append(cs, 2<<20+3)
		}
	}
	return cs
}

// layout places one case's buffers: in place or not, and the input's and
// the output's offset in elements past an aligned allocation (in place: the
// shared buffer's offset, inOff). An offset of one element puts a pointer
// off every vector boundary, as a tensor that is a slice of a larger one.
type layout struct {
	inPlace       bool
	inOff, outOff int
}

func (l layout) String() string {
	s := "out of place"
	if l.inPlace {
		s = "in place"
	}
	if l.inOff != 0 || l.outOff != 0 {
		s += fmt.Sprintf(", input +%d, output +%d elements", l.inOff, l.outOff)
	}
	return s
}

// layouts returns the layouts a count is proved with: aligned out of place
// and in place, then the input alone, the output alone and an in-place
// buffer one element off; the large counts keep only the in-place one of
// those three (they dominate the proof's time).
func layouts(large bool) []layout {
	ls := []layout{{}, {inPlace: true}}
	if !large {
		ls = append(ls, layout{inOff: 1}, layout{outOff: 1})
	}
	return append(ls, layout{inPlace: true, inOff: 1, outOff: 1})
}

// cases returns every (count, layout) a combination is proved with, with
// a distinct seed each.
type proofCase struct {
	n, seed int
	layout
}

func cases(collective coll.Collective, w int, large bool) []proofCase {
	var pcs []proofCase
	cs := counts(collective, w, large)
	for ci, n := range cs {
		for _, l := range layouts(large && ci == len(cs)-1) {
			pcs = append(pcs, proofCase{n: n, seed: len(pcs) + 17, layout: l})
		}
	}
	return pcs
}

// input returns rank's deterministic input for a case.
func input(dtype coll.DType, n, seed, rank int) []byte {
	b := make([]byte, n*dtype.Size())
	if dtype.IsFloat8() {
		r := rand.New(rand.NewPCG(uint64(seed), uint64(rank)+1))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return b
	}
	numeric.Fill(dtype, b, seed, rank)
	return b
}

// expect checks rank's output of one collective against the host reference
// computed from every rank's input.
func expect(c collectives.Combination, rank, w, n int, ins [][]byte, got []byte) error {
	size := c.DType.Size()
	switch c.Collective {
	case "allreduce":
		return numeric.Check(c.DType, c.Op, got, ins)
	case "reduce_scatter":
		part := make([][]byte, w)
		for r := range ins {
			part[r] = ins[r][rank*n*size : (rank+1)*n*size]
		}
		return numeric.Check(c.DType, c.Op, got, part)
	default:
		want := bytes.Join(ins, nil)
		if !bytes.Equal(got, want) {
			for i := range got {
				if got[i] != want[i] {
					return fmt.Errorf("byte %d (element %d of rank %d's part) is %#x, want %#x", i, i/size%n, i/size/n, got[i], want[i])
				}
			}
		}
		return nil
	}
}

// rankCase is one rank's buffers for one collective call.
type rankCase struct {
	in, out   cuda.DevicePtr // out lies inside alloc[0], between the guards
	inBytes   int
	outBytes  int
	alloc     []cuda.DevicePtr
	allBytes  int    // alloc[0]'s size: guards, offset and the largest buffer
	writable  [2]int // byte range of alloc[0] the call may write: the output, or in place the whole buffer
	inputHost []byte
}

// sizes returns input and output element counts for a call with count n.
func sizes(collective coll.Collective, w, n int) (in, out int) {
	switch collective {
	case coll.AllReduce:
		return n, n
	case coll.ReduceScatter:
		return n * w, n
	}
	return n, n * w
}

// prepare allocates and fills one rank's buffers. In place, the output is
// the input buffer (all-reduce), or the input is the rank's slice of the
// output (all-gather), or the output is the rank's slice of the input
// (reduce-scatter), as NCCL defines in-place use.
func prepare(dev *cuda.Device, c collectives.Combination, rank, w, n, seed int, l layout) (*rankCase, error) {
	size := c.DType.Size()
	inN, outN := sizes(c.Collective, w, n)
	rc := &rankCase{inBytes: inN * size, outBytes: outN * size, inputHost: input(c.DType, inN, seed, rank)}
	big := max(inN, outN) * size
	shift := max(l.inOff, l.outOff) * size
	rc.allBytes = big + shift + 2*guard
	buf, err := dev.Alloc(rc.allBytes)
	if err != nil {
		return nil, err
	}
	rc.alloc = append(rc.alloc, buf)
	if err := dev.Memset8(buf, poison, rc.allBytes); err != nil {
		return nil, err
	}
	base := buf + guard
	if l.inPlace {
		base += cuda.DevicePtr(l.inOff * size)
		rc.writable = [2]int{guard + l.inOff*size, guard + l.inOff*size + big}
	}
	switch {
	case !l.inPlace:
		in, err := dev.Alloc(rc.inBytes + l.inOff*size)
		if err != nil {
			return nil, err
		}
		rc.alloc = append(rc.alloc, in)
		rc.in, rc.out = in+cuda.DevicePtr(l.inOff*size), base+cuda.DevicePtr(l.outOff*size)
		rc.writable = [2]int{int(rc.out - buf), int(rc.out-buf) + rc.outBytes}
	case c.Collective == "allreduce":
		rc.in, rc.out = base, base
	case c.Collective == "reduce_scatter":
		rc.in, rc.out = base, base+cuda.DevicePtr(rank*n*size)
	default:
		rc.in, rc.out = base+cuda.DevicePtr(rank*n*size), base
	}
	if err := dev.CopyHtoD(rc.in, rc.inputHost); err != nil {
		return nil, err
	}
	return rc, nil
}

// verify reads back the output and both guards: every byte outside the
// range the call may write (writable) must still be poison.
func (rc *rankCase) verify(dev *cuda.Device, c collectives.Combination, rank, w, n int, ins [][]byte) error {
	buf := rc.alloc[0]
	all := make([]byte, rc.allBytes)
	if err := dev.CopyDtoH(all, buf); err != nil {
		return err
	}
	// The output region within the poisoned buffer.
	off := int(rc.out - buf)
	for i := 0; i < rc.writable[0]; i++ {
		if all[i] != poison {
			return fmt.Errorf("guard before the output overwritten at byte %d", i-off)
		}
	}
	for i := rc.writable[1]; i < len(all); i++ {
		if all[i] != poison {
			return fmt.Errorf("guard after the output overwritten at byte %d past its end", i-off-rc.outBytes)
		}
	}
	return expect(c, rank, w, n, ins, all[off:off+rc.outBytes])
}

func (rc *rankCase) free(dev *cuda.Device) {
	for _, p := range rc.alloc {
		dev.Free(p)
	}
}

// issue runs one collective on a communicator.
func issue(cm *comm.Communicator, c collectives.Combination, rc *rankCase, n int, s *cuda.Stream) error {
	o := comm.Options{Algorithm: coll.Algorithm(c.Algorithm), Stream: s}
	in, out := comm.DeviceBuffer(rc.in), comm.DeviceBuffer(rc.out)
	switch c.Collective {
	case "allreduce":
		return cm.AllReduce(in, out, n, coll.DType(c.DType), coll.Op(c.Op), o)
	case "reduce_scatter":
		return cm.ReduceScatter(in, out, n, coll.DType(c.DType), coll.Op(c.Op), o)
	}
	return cm.AllGather(in, out, n, coll.DType(c.DType), o)
}

// result is one line of the summary.
type result struct {
	mode  string
	combo string
	cases int
	err   error
}

var (
	resultsMu sync.Mutex
	results   []result
)

// record adds a line to the summary (written when the test ends) and
// prints it at once, so that the log of a run killed at its time limit
// still says which combinations passed.
func record(mode, combo string, cases int, err error) {
	resultsMu.Lock()
	results = append(results, result{mode, combo, cases, err})
	resultsMu.Unlock()
	res := "pass"
	if err != nil {
		res = "FAIL"
	}
	fmt.Printf("proof: %s, %s: %d cases, %s\n", mode, combo, cases, res)
}

// writeSummary writes the results table to $PROOF_SUMMARY if set.
func writeSummary(t *testing.T) {
	path := os.Getenv("PROOF_SUMMARY")
	if path == "" || len(results) == 0 {
		return
	}
	sort.Slice(results, func(i, j int) bool {
		if results[i].mode != results[j].mode {
			return results[i].mode < results[j].mode
		}
		return results[i].combo < results[j].combo
	})
	var b strings.Builder
	pass, fail := 0, 0
	for _, r := range results {
		if r.err == nil {
			pass++
		} else {
			fail++
		}
	}
	fmt.Fprintf(&b, "%d combination runs passed, %d failed\n\n| mode | kernel | cases | result |\n|---|---|---:|---|\n", pass, fail)
	for _, r := range results {
		res := "pass"
		if r.err != nil {
			res = "FAIL: " + strings.ReplaceAll(r.err.Error(), "\n", " ")
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s |\n", r.mode, r.combo, r.cases, res)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("summary: %v", err)
		return
	}
	defer f.Close()
	f.WriteString(b.String())
}

// newComms creates world goroutine-rank communicators of one Config on a
// fresh store (commsWith).
func newComms(t *testing.T, w int, cfg comm.Config) []*comm.Communicator {
	t.Helper()
	return commsWith(t, w, rendezvous.NewMemStore(), func(int) comm.Config { return cfg })
}

// commsWith forms a group of world goroutine ranks (cudatest.WorldSize:
// every GPU, or $COLLGEN_TEST_WORLD of them), rank r on GPU r (place), its
// Config from cfg(r). Ranks sharing one GPU get Config.DisableNCCL (NCCL
// refuses two ranks on a device).
// When a rank fails, the communicators made are aborted, so the next test
// starts clean.
func commsWith(t *testing.T, world int, store rendezvous.Store, cfg func(r int) comm.Config) []*comm.Communicator {
	t.Helper()
	comms := make([]*comm.Communicator, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg(r)
			c.Rank, c.WorldSize, c.Store = r, world, store
			place(&c, r)
			if sharedGPU() && world > 1 {
				c.DisableNCCL = true
			}
			if c.Library == nil {
				c.Library = collectives.Library
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			comms[r], errs[r] = comm.New(ctx, c)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			if c != nil {
				c.Abort()
			}
		}
		t.Fatalf("comm.New at world %d: %v", world, err)
	}
	return comms
}

// closeComms closes every rank's communicator at once (Close is collective).
func closeComms(comms []*comm.Communicator) error {
	return ranks(comms, func(_ int, c *comm.Communicator) error { return c.Close() })
}

// TestProofGoroutines proves every combination with goroutine ranks (peer
// access) at every world size the machine has GPUs for: eager, in place and
// out of place, all counts including large; then graph capture and replay.
func TestProofGoroutines(t *testing.T) {
	ngpu := proofGPUs(t)
	defer writeSummary(t)
	for _, w := range worlds(ngpu) {
		comms := newComms(t, w, comm.Config{Library: collectives.Library, StagingBytes: stagingBytes, DisableNCCL: true, Group: fmt.Sprintf("proof-w%d", w)})
		for _, c := range collectives.Combinations {
			if c.World != w || !selected(c.Kernel) {
				continue
			}
			proveAndRecord(t, "goroutines", comms, c)
		}
		if err := closeComms(comms); err != nil {
			t.Errorf("close at world %d: %v", w, err)
		}
	}
}

// proveAndRecord proves a combination on goroutine ranks (every count and
// layout, then graph replay), records the summary line under mode, and
// fails the test on an error.
func proveAndRecord(t *testing.T, mode string, comms []*comm.Communicator, c collectives.Combination) {
	t.Helper()
	cases, err := proveCombination(comms, c, true)
	if err == nil {
		var g int
		g, err = proveGraph(comms, c)
		cases += g
	}
	record(mode, c.Kernel, cases, err)
	if err != nil {
		t.Errorf("%s: %v", c.Kernel, err)
	} else {
		t.Logf("%s: %s, %d cases pass", mode, c.Kernel, cases) // progress, streamed under -test.v
	}
}

// selected reports whether $PROOF_ONLY (a path.Match glob over kernel
// names, e.g. '*_ll_*') keeps a kernel; unset keeps all.
func selected(kernel string) bool {
	glob := os.Getenv("PROOF_ONLY")
	if glob == "" {
		return true
	}
	ok, err := path.Match(glob, kernel)
	return ok && err == nil
}

// worlds returns the world sizes to prove: $PROOF_WORLDS or 2, 3, 4 up to
// the GPU count.
func worlds(ngpu int) []int {
	var ws []int
	if s := os.Getenv("PROOF_WORLDS"); s != "" {
		for _, f := range strings.Split(s, ",") {
			if w, err := strconv.Atoi(f); err == nil && w <= ngpu {
				ws = append(ws, w)
			}
		}
		return ws
	}
	for _, w := range []int{2, 3, 4, 8} {
		if w <= ngpu {
			ws = append(ws, w)
		}
	}
	return ws
}

// proveCombination runs every case (count and layout) on all ranks at once
// and checks every rank's output and guards.
func proveCombination(comms []*comm.Communicator, c collectives.Combination, large bool) (int, error) {
	pcs := cases(c.Collective, len(comms), large)
	for i, pc := range pcs {
		if err := runCase(comms, c, pc.n, pc.seed, pc.layout); err != nil {
			return i, fmt.Errorf("count %d, %v: %w", pc.n, pc.layout, err)
		}
	}
	return len(pcs), nil
}

// runCase prepares every rank, issues the collective, and verifies.
func runCase(comms []*comm.Communicator, c collectives.Combination, n, seed int, l layout) error {
	w := len(comms)
	rcs := make([]*rankCase, w)
	errs := make([]error, w)
	var wg sync.WaitGroup
	for r, cm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rcs[r], errs[r] = prepare(cm.Device(), c, r, w, n, seed, l)
		}()
	}
	wg.Wait()
	defer func() {
		for r, rc := range rcs {
			if rc != nil {
				rc.free(comms[r].Device())
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	ins := make([][]byte, w)
	for r := range rcs {
		ins[r] = rcs[r].inputHost
	}
	for r, cm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = issue(cm, c, rcs[r], n, nil); errs[r] != nil {
				return
			}
			errs[r] = rcs[r].verify(cm.Device(), c, r, w, n, ins)
			if errs[r] != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// proveGraph captures three collectives of one combination into a CUDA
// graph on every rank and replays it five times; the output (out of place,
// inputs unchanged) must be right after the replays, and the barrier
// sequence must stay in step across replays.
func proveGraph(comms []*comm.Communicator, c collectives.Combination) (int, error) {
	n := 4099
	if c.Collective != "allreduce" {
		n = 1031
	}
	return proveGraphCount(comms, c, n)
}

// proveGraphCount is proveGraph with n elements (per rank for
// reduce-scatter and all-gather).
func proveGraphCount(comms []*comm.Communicator, c collectives.Combination, n int) (int, error) {
	w := len(comms)
	rcs := make([]*rankCase, w)
	errs := make([]error, w)
	ins := make([][]byte, w)
	var wg sync.WaitGroup
	for r, cm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := cm.Device()
			rc, err := prepare(dev, c, r, w, n, 99, layout{})
			if err != nil {
				errs[r] = err
				return
			}
			rcs[r] = rc
			ins[r] = rc.inputHost
		}()
	}
	wg.Wait()
	defer func() {
		for r, rc := range rcs {
			if rc != nil {
				rc.free(comms[r].Device())
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	for r, cm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				dev := cm.Device()
				s, err := dev.NewStream()
				if err != nil {
					return err
				}
				defer s.Destroy()
				// Warm up outside the capture: compile/load happens here.
				if err := issue(cm, c, rcs[r], n, s); err != nil {
					return err
				}
				if err := s.Synchronize(); err != nil {
					return err
				}
				if err := s.BeginCapture(); err != nil {
					return err
				}
				for i := 0; i < 3; i++ {
					if err := issue(cm, c, rcs[r], n, s); err != nil {
						s.EndCapture()
						return err
					}
				}
				g, err := s.EndCapture()
				if err != nil {
					return err
				}
				defer g.Destroy()
				ge, err := g.Instantiate()
				if err != nil {
					return err
				}
				defer ge.Destroy()
				for i := 0; i < 5; i++ {
					if err := ge.Launch(s); err != nil {
						return err
					}
				}
				if err := cm.Synchronize(s); err != nil {
					return err
				}
				return rcs[r].verify(dev, c, r, w, n, ins)
			}()
			if errs[r] != nil {
				errs[r] = fmt.Errorf("graph replay, rank %d: %w", r, errs[r])
			}
		}()
	}
	wg.Wait()
	return 1, errors.Join(errs...)
}

// TestTimeoutReported checks that a rank whose peer never arrives gets a
// TimeoutError naming the collective, itself and the peer, within the
// deadline, instead of hanging, and that the communicator stays broken
// (a push kernel's inbox may hold part of the abandoned collective; under
// the Lamport protocol, whose lines say by their data alone that they
// have arrived, a later collective must never read it). The Lamport
// algorithms run where the library has them
// (tests/gpu/patches/lamport.patch).
func TestTimeoutReported(t *testing.T) {
	proofGPUs(t)
	algs := []string{"oneshot", "oneshot_ll", "twoshot_ll", "twoshot_ll128"}
	for _, a := range []coll.Algorithm{coll.OneShotLamport, coll.TwoShotLamport} {
		if _, ok := collectives.Library.Kernel(coll.AllReduce, a, coll.F32, coll.Sum, 2); ok {
			algs = append(algs, string(a))
		}
	}
	for _, alg := range algs {
		t.Run(alg, func(t *testing.T) {
			comms := newComms(t, 2, comm.Config{Library: collectives.Library, DisableNCCL: true, Timeout: 300 * time.Millisecond, Group: "timeout-" + alg})
			defer closeComms(comms)
			dev := comms[0].Device()
			buf := deviceMem(t, dev, 4096)
			defer dev.Free(buf)
			start := time.Now()
			err := comms[0].AllReduce(comm.DeviceBuffer(buf), comm.DeviceBuffer(buf), 1024, "f32", "sum", comm.Options{Algorithm: coll.Algorithm(alg)})
			var te *comm.TimeoutError
			if !errors.As(err, &te) {
				t.Fatalf("got %v, want a *comm.TimeoutError", err)
			}
			if want := "allreduce_" + alg + "_f32_sum_w2"; te.Rank != 0 || te.Peer != 1 || te.Kernel != want {
				t.Errorf("timeout names rank %d, peer %d, kernel %s; want 0, 1, %s", te.Rank, te.Peer, te.Kernel, want)
			}
			k, _ := collectives.Library.Kernel(coll.AllReduce, coll.Algorithm(alg), coll.F32, coll.Sum, 2)
			if push := k != nil && k.Push(); te.Data != push {
				t.Errorf("Data = %v, want %v (push kernels wait for data, not barriers)", te.Data, push)
			}
			if el := time.Since(start); el > 10*time.Second {
				t.Errorf("timeout took %v", el)
			}
			t.Logf("error: %v (after %v)", err, time.Since(start))
			if err := comms[0].AllReduce(comm.DeviceBuffer(buf), comm.DeviceBuffer(buf), 1024, "f32", "sum", comm.Options{}); !errors.As(err, &te) {
				t.Errorf("a broken communicator accepted another collective: %v", err)
			}
		})
	}
}

// TestMismatchReportedGPU checks that ranks issuing different collectives
// (after a first call they agree on, the last rank runs the LL one-shot
// where the others run the barrier one-shot, so neither kind signals what
// the other waits for) all time out, and that each error names the call
// that differs from the peer's own account of its calls (reliability case
// 95). At world 3 the two barrier ranks meet each other's barriers and
// time out on the last rank; the last rank names whichever it waited for.
func TestMismatchReportedGPU(t *testing.T) {
	ngpu := proofGPUs(t)
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprintf("world%d", world), func(t *testing.T) {
			if world > ngpu {
				t.Skipf("needs %d GPUs (or COLLGEN_TEST_SHARE_GPU=1)", world)
			}
			mismatchReported(t, world)
		})
	}
}

// mismatchReported is TestMismatchReportedGPU at one world size.
func mismatchReported(t *testing.T, world int) {
	comms := newComms(t, world, comm.Config{Library: collectives.Library, DisableNCCL: true, Timeout: 500 * time.Millisecond,
		Group: fmt.Sprintf("mismatch-w%d", world)})
	defer closeComms(comms)
	last := world - 1
	errs := rankErrs(comms, func(r int, c *comm.Communicator) error {
		dev := c.Device()
		buf, err := dev.Alloc(4096)
		if err != nil {
			return err
		}
		defer dev.Free(buf)
		b := comm.DeviceBuffer(buf)
		if err := c.AllReduce(b, b, 1024, "f32", "sum", comm.Options{Algorithm: coll.OneShot}); err != nil {
			return err
		}
		alg := coll.OneShot
		if r == last {
			alg = coll.OneShotLL
		}
		return c.AllReduce(b, b, 1024, "f32", "sum", comm.Options{Algorithm: alg})
	})
	const ll, barrier = "oneshot_ll (runs oneshot_ll)", "oneshot (runs oneshot)"
	for r, err := range errs {
		var te *comm.TimeoutError
		if !errors.As(err, &te) {
			t.Fatalf("rank %d: got %v, want a *comm.TimeoutError", r, err)
		}
		want := fmt.Sprintf("rank %d issued a different call 2: allreduce of 1024 f32 sum, algorithm %s, where this rank issued allreduce of 1024 f32 sum, algorithm %s", last, ll, barrier)
		if r == last {
			want = fmt.Sprintf("rank %d issued a different call 2: allreduce of 1024 f32 sum, algorithm %s, where this rank issued allreduce of 1024 f32 sum, algorithm %s", te.Peer, barrier, ll)
		}
		if !strings.Contains(te.Calls, want) {
			t.Errorf("rank %d: %v\nwant its account to say %q", r, err, want)
		}
		t.Logf("rank %d: %v", r, err)
	}
}

// stacksAfter logs every goroutine's stack once d has passed, prefixed by
// what, unless the returned timer is stopped first: where a call that
// should have ended still waits.
func stacksAfter(t *testing.T, d time.Duration, what string) *time.Timer {
	return time.AfterFunc(d, func() {
		buf := make([]byte, 1<<20)
		t.Logf("%s; goroutines:\n%s", what, buf[:runtime.Stack(buf, true)])
	})
}

// deviceMem allocates bytes on dev for a test and fails it if that fails;
// only from the test's own goroutine (t.Fatal), never from a rank's.
// The caller frees it (defer dev.Free), so it goes before what was
// deferred earlier, such as the communicators' Close.
func deviceMem(t *testing.T, dev *cuda.Device, bytes int) cuda.DevicePtr {
	t.Helper()
	p, err := dev.Alloc(bytes)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestForcedAlgorithmRefused checks that an algorithm the library lacks, a
// push kernel without rounds whose inbox would exceed the staging buffer,
// or disabled NCCL is refused with the reason.
func TestForcedAlgorithmRefused(t *testing.T) {
	proofGPUs(t)
	comms := newComms(t, 2, comm.Config{Library: collectives.Library, DisableNCCL: true, StagingBytes: 1 << 20, Group: "refuse"})
	defer closeComms(comms)
	dev := comms[0].Device()
	buf := deviceMem(t, dev, 4<<20)
	defer dev.Free(buf)
	b := comm.DeviceBuffer(buf)
	cases := []struct {
		alg  string
		n    int
		want string
	}{
		{"hcm", 16, "has no kernel hcm"},
		{"nccl", 16, "disabled by Config.DisableNCCL"},
	}
	for _, c := range cases {
		err := comms[0].AllReduce(b, b, c.n, "f32", "sum", comm.Options{Algorithm: coll.Algorithm(c.alg)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s with %d elements: got %v, want %q", c.alg, c.n, err, c.want)
		}
	}
	// A reduce-scatter's LL push one-shot runs in one round (barrier
	// kernels and the other push kernels run in rounds instead:
	// TestProofWindows): 2 MiB of inbox over the 1 MiB area is refused.
	err := comms[0].ReduceScatter(b, b, 256<<10, "f32", "sum", comm.Options{Algorithm: coll.OneShotLL})
	if err == nil || !strings.Contains(err.Error(), "of inbox") {
		t.Errorf("reduce-scatter oneshot_ll of 2 MiB: got %v, want a refusal naming the inbox", err)
	}
}

// processConfig is a process rank's communicator: kernels from
// $COLLGEN_FATBIN when run.sh built one, NVRTC otherwise.
func processConfig(env rendezvous.Env, store rendezvous.Store, staging int64, group string) comm.Config {
	cfg := comm.Config{Rank: env.Rank, WorldSize: env.WorldSize, Store: store,
		Library: collectives.Library, StagingBytes: staging, DisableNCCL: true, FatbinPath: os.Getenv("COLLGEN_FATBIN"), Group: group,
		// run.sh builds the fatbin of $PROOF_ONLY's kernels only: load
		// those on use rather than every kernel of the world at New.
		LazyKernels: os.Getenv("PROOF_ONLY") != ""}
	place(&cfg, env.LocalRank)
	return cfg
}

// processRank is the set-up of one process rank (started by collgen run;
// skipped otherwise): a communicator of the run's ranks with the given
// staging size and group, closed and its context cancelled when the test
// ends (2 minutes).
func processRank(t *testing.T, staging int64, group string) (*comm.Communicator, context.Context, int) {
	t.Helper()
	if os.Getenv("COLLGEN_RANK") == "" {
		t.Skip("run through collgen run (tests/proof/run.sh)")
	}
	proofGPUs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	env, store, err := rendezvous.FromEnv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cm, err := comm.New(ctx, processConfig(env, store, staging, group))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cm.Close() })
	return cm, ctx, env.Rank
}

// TestProofProcess is one rank of the process-per-GPU proof, started by
// `collgen run -n W -- proof.test -test.run TestProofProcess` (see
// tests/proof/run.sh): IPC handles instead of peer access, fatbin loading
// when $COLLGEN_FATBIN is set.
func TestProofProcess(t *testing.T) {
	cm, _, rank := processRank(t, stagingBytes, "proof-proc")
	defer writeSummary(t)
	w := cm.WorldSize()
	for _, c := range collectives.Combinations {
		if c.World != w || !selected(c.Kernel) {
			continue
		}
		pcs := cases(c.Collective, w, false)
		var cerr error
		for _, pc := range pcs {
			rc, err := prepare(cm.Device(), c, rank, w, pc.n, pc.seed, pc.layout)
			if err == nil {
				ins := make([][]byte, w)
				for r := range ins {
					inN, _ := sizes(c.Collective, w, pc.n)
					ins[r] = input(c.DType, inN, pc.seed, r)
				}
				if err = issue(cm, c, rc, pc.n, nil); err == nil {
					err = rc.verify(cm.Device(), c, rank, w, pc.n, ins)
				}
				rc.free(cm.Device())
			}
			if err != nil && cerr == nil {
				cerr = fmt.Errorf("rank %d, count %d, %v: %w", rank, pc.n, pc.layout, err)
			}
		}
		if rank == 0 || cerr != nil {
			record(fmt.Sprintf("processes (rank %d)", rank), c.Kernel, len(pcs), cerr)
		}
		if cerr != nil {
			t.Errorf("%s: %v", c.Kernel, cerr)
		}
	}
}

// Zero-copy proof sizes: push kernels (never zero-copy) need their inbox
// area to hold the 100003-element count, more than the rules' default
// sizing: at world 8 an f32 LL all-gather's or reduce-scatter's inbox is
// 5600224 bytes (4 MiB held world 4's, and refused world 8's). zcBig is
// larger than the whole zcStaging buffer.
const zcStaging, zcBig = 8 << 20, 9 << 20 // bytes

// zcRun is one count of the zero-copy proofs: calls back-to-back calls
// with the input off elements past the symmetric buffer's start; big
// marks the message larger than the whole staging buffer.
type zcRun struct {
	n, calls, off int
	big           bool
}

// zeroCopyCounts are the runs the zero-copy proofs make for kernel c: two
// counts three times, the larger also with the input one element in (peers
// then read it off every vector boundary), and for a barrier kernel without
// scratch one message larger than the whole staging buffer twice
// (zero-copy needs none; two-shot and hcm still reduce into scratch, a
// push kernel sends into its inbox).
func zeroCopyCounts(c collectives.Combination, w int) []zcRun {
	runs := []zcRun{{33, 3, 0, false}, {100003, 3, 0, false}, {100003, 2, 1, false}}
	if k, ok := collectives.Library.Kernel(c.Collective, c.Algorithm, c.DType, c.Op, w); ok && !k.Push() && !k.UsesScratch {
		in, _ := sizes(c.Collective, w, 1)
		runs = append(runs, zcRun{zcBig/(in*c.DType.Size()) + 1, 2, 0, true})
	}
	return runs
}

// zeroCopyCase runs one call of kernel c on rank r with its input written
// into the symmetric buffer at src, and checks the output.
func zeroCopyCase(cm *comm.Communicator, c collectives.Combination, r, w, n, seed int, src cuda.DevicePtr) error {
	inN, outN := sizes(c.Collective, w, n)
	size := c.DType.Size()
	ins := make([][]byte, w)
	for p := range ins {
		ins[p] = input(c.DType, inN, seed, p)
	}
	dev := cm.Device()
	if err := dev.CopyHtoD(src, ins[r]); err != nil {
		return err
	}
	out, err := dev.Alloc(outN * size)
	if err != nil {
		return err
	}
	defer dev.Free(out)
	rc := &rankCase{in: src, out: out, inBytes: inN * size, outBytes: outN * size}
	if err := issue(cm, c, rc, n, nil); err != nil {
		return err
	}
	got := make([]byte, outN*size)
	if err := dev.CopyDtoH(got, out); err != nil {
		return err
	}
	return expect(c, r, w, n, ins, got)
}

// TestProofZeroCopy proves the zero-copy path with goroutine ranks: inputs
// in symmetric memory are read in place by peers, with one stage slot and
// the final barrier kept. Every kernel of the largest world the machine
// has (all three collectives; push kernels take the same inputs and send
// from them), inputs alternating between Communicator.Alloc's buffers and
// a user's own symm.Pool given to UseSymmetric, the counts of
// zeroCopyCounts back to back (the caller overwrites its input between
// calls, which the final barrier must make safe).
func TestProofZeroCopy(t *testing.T) {
	ngpu := proofGPUs(t)
	defer writeSummary(t)
	ws := worlds(ngpu)
	w := ws[len(ws)-1]
	comms := newComms(t, w, comm.Config{Library: collectives.Library, DisableNCCL: true, StagingBytes: zcStaging, Group: "zerocopy"})
	defer closeComms(comms)
	const maxBytes = 2 * zcBig
	syms := make([]cuda.DevicePtr, w)
	pooled := make([]cuda.DevicePtr, w)
	errs := make([]error, w)
	st := rendezvous.NewMemStore()
	var wg sync.WaitGroup
	for r, cm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() (err error) {
				ctx := context.Background()
				if syms[r], err = cm.Alloc(ctx, maxBytes); err != nil {
					return err
				}
				be, err := symm.NewCUDABackend(cm.Device(), nil)
				if err != nil {
					return err
				}
				t.Cleanup(func() { be.Close() })
				pool, err := symm.NewPool(ctx, symm.Config{Group: "proof-user", Rank: r, WorldSize: w, Store: st, Backend: be})
				if err != nil {
					return err
				}
				t.Cleanup(func() { pool.Close() })
				buf, err := pool.Alloc(maxBytes)
				if err != nil {
					return err
				}
				if _, err := pool.Rendezvous(ctx, buf); err != nil {
					return err
				}
				pooled[r] = cuda.DevicePtr(buf.Addr())
				return cm.UseSymmetric(ctx, pool)
			}()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, c := range collectives.Combinations {
		if c.World != w || !selected(c.Kernel) {
			continue
		}
		cases := 0
		var cerr error
		for _, run := range zeroCopyCounts(c, w) {
			n, off := run.n, cuda.DevicePtr(run.off*c.DType.Size())
			for call := 0; call < run.calls && cerr == nil; call++ {
				src := syms // the input's symmetric buffer, by rank: alternate the two kinds
				if call%2 == 1 {
					src = pooled
				}
				for r, cm := range comms {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if errs[r] = zeroCopyCase(cm, c, r, w, n, n+call, src[r]+off); errs[r] != nil {
							errs[r] = fmt.Errorf("rank %d, count %d, input +%d elements, call %d: %w", r, n, run.off, call, errs[r])
						}
					}()
				}
				wg.Wait()
				cerr = errors.Join(errs...)
				cases++
			}
		}
		record("zero-copy (goroutines)", c.Kernel, cases, cerr)
		if cerr != nil {
			t.Errorf("%s: %v", c.Kernel, cerr)
		}
	}
}

// TestProofProcessZeroCopy is TestProofZeroCopy with process ranks (run
// through collgen run): Communicator.Alloc's memory crosses processes as
// VMM file descriptors over Unix sockets, and every kernel of the world
// reads it in place.
func TestProofProcessZeroCopy(t *testing.T) {
	cm, ctx, rank := processRank(t, zcStaging, "proof-proc-zc")
	defer writeSummary(t)
	w := cm.WorldSize()
	sym, err := cm.Alloc(ctx, 2*zcBig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range collectives.Combinations {
		if c.World != w || !selected(c.Kernel) {
			continue
		}
		cases := 0
		var cerr error
		for _, run := range zeroCopyCounts(c, w) {
			n, off := run.n, cuda.DevicePtr(run.off*c.DType.Size())
			for call := 0; call < run.calls; call++ { // every call even after an error: peers make them too
				if err := zeroCopyCase(cm, c, rank, w, n, n+call, sym+off); err != nil && cerr == nil {
					cerr = fmt.Errorf("rank %d, count %d, input +%d elements, call %d: %w", rank, n, run.off, call, err)
				}
				cases++
			}
		}
		if rank == 0 || cerr != nil {
			record(fmt.Sprintf("zero-copy processes (rank %d)", rank), c.Kernel, cases, cerr)
		}
		if cerr != nil {
			t.Errorf("%s: %v", c.Kernel, cerr)
		}
	}
}
