package proof

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/nccl"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// envFaultChild marks the child process of TestPeerFaultGPU (rank 1); its
// value is the file store's directory.
const envFaultChild = "COLLGEN_TEST_FAULT_STORE"

// peerFaults are TestPeerFaultGPU's cases: how the peer process fails
// (SIGKILL, or SIGSTOP and SIGKILL once the survivor has failed), under
// which algorithm, at which size (bf16 elements). The hier cases put each
// rank on a "host" of its own (Config.HostID), so the group runs the
// hierarchical backend and its NCCL across hosts, whose kernels have no
// deadline: only the backend's bounded waits (reliability case 96) stand
// between the survivor and a hang; nonBlocking opens that NCCL
// non-blocking (Config.NCCLNonBlocking).
var peerFaults = []peerFaultCase{
	{name: "nccl-kill", alg: coll.NCCL, n: 32 << 20, signal: syscall.SIGKILL},
	{name: "oneshot-kill", alg: coll.OneShot, n: 1 << 20, signal: syscall.SIGKILL},
	{name: "oneshot_ll-kill", alg: coll.OneShotLL, n: 64 << 10, signal: syscall.SIGKILL},
	{name: "twoshot-stop", alg: coll.TwoShot, n: 4 << 20, signal: syscall.SIGSTOP},
	{name: "oneshot_ll-stop", alg: coll.OneShotLL, n: 64 << 10, signal: syscall.SIGSTOP},
	{name: "hier-kill", alg: coll.Hierarchical, n: 8 << 20, signal: syscall.SIGKILL, hosts: true},
	{name: "hier-stop", alg: coll.Hierarchical, n: 8 << 20, signal: syscall.SIGSTOP, hosts: true},
	{name: "hier-kill-nonblocking", alg: coll.Hierarchical, n: 8 << 20, signal: syscall.SIGKILL, hosts: true, nonBlocking: true},
}

// peerFaultCase is one of peerFaults.
type peerFaultCase struct {
	name        string
	alg         coll.Algorithm
	n           int
	signal      syscall.Signal
	hosts       bool
	nonBlocking bool
}

// TestPeerFaultGPU (reliability cases 6 and 7 on GPUs): two process ranks
// loop all-reduces of one algorithm; rank 1 is SIGKILLed, or SIGSTOPped
// (a stopped process's queued kernels still run, but it launches no
// more), while collectives are queued. Rank 0 must get ErrTimeout or
// ErrAborted within Config.Timeout plus slack, never hang, and Abort must
// then return promptly; a stopped peer is SIGKILLed after.
func TestPeerFaultGPU(t *testing.T) {
	proofGPUs(t)
	for _, tc := range peerFaults {
		t.Run(tc.name, func(t *testing.T) {
			if tc.alg == coll.NCCL || tc.hosts {
				cudatest.OwnGPUs(t)
				if _, err := nccl.Load(); err != nil {
					t.Skipf("NCCL: %v", err)
				}
			}
			peerFault(t, tc)
		})
	}
}

func peerFault(t *testing.T, tc peerFaultCase) {
	alg, n, signal, hosts := tc.alg, tc.n, tc.signal, tc.hosts
	const timeout = 5 * time.Second
	dir := os.Getenv(envFaultChild)
	child := dir != ""
	rank := 0
	if child {
		rank = 1
	} else {
		dir = t.TempDir()
	}
	store, err := rendezvous.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Closed before the temporary directory goes: after Abort the rank
	// polls the store for its peers' leaving (comm's freeWhenLeft) until
	// the store is closed.
	defer store.Close()
	var cmd *exec.Cmd
	if !child {
		cmd = exec.Command(os.Args[0], "-test.run", "^TestPeerFaultGPU$/^"+t.Name()[len("TestPeerFaultGPU/"):]+"$", "-test.v")
		cmd.Env = append(os.Environ(), envFaultChild+"="+dir)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			cmd.Process.Kill()
			cmd.Wait()
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := comm.Config{Rank: rank, WorldSize: 2, Store: store, Library: collectives.Library, Group: "peer-fault", Timeout: timeout,
		DisableNCCL: alg != coll.NCCL && !hosts && sharedGPU(), NCCLNonBlocking: tc.nonBlocking}
	if hosts {
		cfg.HostID = fmt.Sprintf("host%d", rank)
	}
	place(&cfg, rank)
	c, err := comm.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := c.Device()
	buf, err := d.Alloc(2 * n)
	if err != nil {
		t.Fatal(err)
	}
	b := comm.DeviceBuffer(buf)
	o := comm.Options{Algorithm: alg}
	if child {
		for end := time.Now().Add(time.Minute); time.Now().Before(end); {
			if err := c.AllReduce(b, b, n, coll.BF16, coll.Sum, o); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	defer d.Free(buf)
	for i := 0; i < 20; i++ {
		if err := c.AllReduce(b, b, n, coll.BF16, coll.Sum, o); err != nil {
			t.Fatalf("iteration %d before the fault: %v", i, err)
		}
	}
	// Enqueue without waiting, so the fault lands while collectives run.
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	so := comm.Options{Algorithm: alg, Stream: s}
	for i := 0; i < 4; i++ {
		if err := c.AllReduce(b, b, n, coll.BF16, coll.Sum, so); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Process.Signal(signal); err != nil {
		t.Fatal(err)
	}
	if signal == syscall.SIGKILL {
		cmd.Wait()
	}
	hit := time.Now()
	if alg == coll.NCCL || hosts {
		// NCCL work on s, then on a second stream, after the fault: the
		// wait below is on s, not on the stream NCCL work last went on,
		// which a communicator that remembered only the last such stream
		// waited for without a bound (reliability case 96). An enqueue
		// may already fail (NCCL saw the peer go); then nothing is pending.
		s2, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Destroy()
		err = c.AllReduce(b, b, n, coll.BF16, coll.Sum, so)
		if err == nil {
			err = c.AllReduce(b, b, n, coll.BF16, coll.Sum, comm.Options{Algorithm: alg, Stream: s2})
		}
		t.Logf("NCCL work on two streams after the %v: %v", signal, err)
	}
	var ferr error
	for ferr == nil && time.Since(hit) < 10*timeout {
		if ferr = c.Synchronize(s); ferr == nil {
			ferr = c.AllReduce(b, b, n, coll.BF16, coll.Sum, so)
		}
	}
	el := time.Since(hit)
	t.Logf("survivor: %v after %v", ferr, el)
	if !errors.Is(ferr, comm.ErrTimeout) && !errors.Is(ferr, comm.ErrAborted) {
		t.Errorf("survivor got %v, want ErrTimeout or ErrAborted", ferr)
	}
	if el > 2*timeout+5*time.Second {
		t.Errorf("survivor's error came %v after the %v (Config.Timeout %v)", el, signal, timeout)
	}
	if signal == syscall.SIGSTOP {
		// Still stopped, still alive: the survivor did not wait for it.
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("the stopped peer is gone before its SIGKILL: %v", err)
		}
		cmd.Process.Kill()
		cmd.Wait()
	}
	start := time.Now()
	if err := c.Abort(); err != nil {
		t.Logf("Abort: %v", err)
	}
	if el := time.Since(start); el > timeout+5*time.Second {
		t.Errorf("Abort after the peer's %v took %v", signal, el)
	}
}

// TestRecycledRegionGPU (reliability case 19 for comm's staging region):
// three generations of communicators on the same GPUs, each closed before
// the next is made, run the same push and barrier all-reduces from the
// same first sequence numbers, with new inputs each time. The driver
// tends to hand a freed region's addresses to the next allocation, so a
// region not cleared at New would hold the last generation's flags, equal
// to the new generation's first ones, and a poll would take the old data
// as arrived: the check would fail.
func TestRecycledRegionGPU(t *testing.T) {
	proofGPUs(t)
	const n = 3000 // bf16 elements, not a multiple of 8
	algs := []coll.Algorithm{coll.OneShotLL, coll.OneShotLL128, coll.TwoShotLL128, coll.OneShot, coll.TwoShot}
	for gen := 0; gen < 3; gen++ {
		store := rendezvous.NewMemStore()
		comms := commsWith(t, cudatest.WorldSize(t, 2), store, func(int) comm.Config { return comm.Config{Timeout: 20 * time.Second} })
		var err error
		for i, alg := range algs {
			if err = checkedAllReduce(comms, alg, coll.BF16, n, 100*gen+i); err != nil {
				err = fmt.Errorf("generation %d, %s: %w", gen, alg, err)
				break
			}
		}
		if cerr := closeComms(comms); err == nil {
			err = cerr
		}
		store.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestAbortOneRankGPU (reliability case 9): rank 0 aborts while rank 1
// lives on; rank 1's next collective, whose kernel signals into rank 0's
// staging region (the barrier kernels' arrival signal, the LL kernels'
// data lines) and then waits for rank 0, must end in a TimeoutError and
// leave the device working: Abort keeps the region until its peers have
// left the group. Freed at Abort (before), the peer's kernel hit
// CUDA_ERROR_ILLEGAL_ADDRESS, a sticky error of its context (with
// goroutine ranks the process's). Goroutine ranks; runs on one shared GPU
// too (COLLGEN_TEST_SHARE_GPU).
func TestAbortOneRankGPU(t *testing.T) {
	proofGPUs(t)
	for _, alg := range []coll.Algorithm{coll.OneShot, coll.OneShotLL} {
		t.Run(string(alg), func(t *testing.T) {
			comms := newComms(t, 2, comm.Config{Library: collectives.Library, DisableNCCL: true, Timeout: 2 * time.Second, Group: "abort-one-" + string(alg)})
			defer comms[1].Abort()
			// Both ranks have joined and run a collective.
			if err := checkedAllReduce(comms, alg, coll.F32, 1024, 7); err != nil {
				t.Fatal(err)
			}
			if err := comms[0].Abort(); err != nil {
				t.Fatalf("Abort: %v", err)
			}
			dev := comms[1].Device()
			buf := deviceMem(t, dev, 1<<20)
			defer dev.Free(buf)
			b := comm.DeviceBuffer(buf)
			err := comms[1].AllReduce(b, b, 1024, coll.F32, coll.Sum, comm.Options{Algorithm: alg})
			if err == nil {
				err = comms[1].Synchronize(nil)
			}
			if !errors.Is(err, comm.ErrTimeout) {
				t.Errorf("the live rank's collective after its peer's Abort: %v, want ErrTimeout", err)
			}
			t.Logf("live rank: %v", err)
			// The context is not faulted: memory operations still work.
			host := make([]byte, 1<<20)
			if err := dev.Memset8(buf, 0x5a, 1<<20); err != nil {
				t.Fatalf("memset on the live rank's device after the timeout: %v", err)
			}
			if err := dev.CopyDtoH(host, buf); err != nil || host[len(host)-1] != 0x5a {
				t.Fatalf("copy on the live rank's device after the timeout: %v (last byte %#x)", err, host[len(host)-1])
			}
		})
	}
}

// TestLazyKernelsSharedGPU: with Config.LazyKernels, goroutine ranks
// sharing one GPU run barrier and LL all-reduces, both ranks launching
// each kernel for the first time at once. A kernel loaded at its first
// launch may synchronize the context, which would wait for the peer's
// kernel, itself waiting for this rank, until the timeout; New loads
// every kernel where ranks share a GPU, LazyKernels or not. Runs with
// COLLGEN_TEST_SHARE_GPU only.
func TestLazyKernelsSharedGPU(t *testing.T) {
	if !sharedGPU() {
		t.Skip("needs ranks sharing a GPU (COLLGEN_TEST_SHARE_GPU=1)")
	}
	proofGPUs(t)
	comms := newComms(t, 2, comm.Config{Library: collectives.Library, DisableNCCL: true, LazyKernels: true,
		Timeout: 5 * time.Second, Group: "lazy-shared"})
	defer closeComms(comms)
	for i, alg := range []coll.Algorithm{coll.OneShot, coll.OneShotLL, coll.TwoShot} {
		if err := checkedAllReduce(comms, alg, coll.BF16, 4096+i, 40+i); err != nil {
			t.Fatalf("%s: %v", alg, err)
		}
	}
}

// TestCloseWhilePeerWaitsGPU (reliability case 39): goroutine ranks in
// two groups, A and B. Rank 0 queues a B all-reduce (its kernel waits for
// rank 1) and then closes A; rank 1 closes A and only then calls its B
// all-reduce. Where the ranks share a GPU, and so a CUDA context, a Close
// that frees its staging region with cuMemFree at once waits for rank 0's
// B kernel, itself waiting for rank 1's B call behind that Close: both
// ranks stall until the kernel's deadline and B times out. Close must
// return promptly and B's result be right. On GPUs of their own (no
// shared context) it passes either way.
func TestCloseWhilePeerWaitsGPU(t *testing.T) {
	proofGPUs(t)
	for _, alg := range []coll.Algorithm{coll.OneShot, coll.OneShotLL} {
		t.Run(string(alg), func(t *testing.T) {
			a := commsWith(t, 2, rendezvous.NewMemStore(), besideConfig("close-a-"+string(alg)))
			b := commsWith(t, 2, rendezvous.NewMemStore(), besideConfig("close-b-"+string(alg)))
			defer closeComms(b)
			besidePeerKernel(t, b, alg, "Close of A", func(r int) error { return a[r].Close() })
		})
	}
}

// TestNewWhilePeerWaitsGPU (reliability case 39, New's half): goroutine
// ranks in group B; rank 0 queues a B all-reduce (its kernel waits for
// rank 1) and then joins a new group C; rank 1 joins C and only then
// calls its B all-reduce. Loading a module waits for every kernel of the
// context, so where the ranks share a GPU a New that loaded C's kernels
// waited for rank 0's B kernel until its deadline; C takes the modules B
// loaded (the process's module share) and loads none. Then C's own
// all-reduce runs, and its result is checked.
func TestNewWhilePeerWaitsGPU(t *testing.T) {
	proofGPUs(t)
	start := time.Now()
	b := commsWith(t, 2, rendezvous.NewMemStore(), besideConfig("new-b"))
	t.Logf("B's New: %v", time.Since(start))
	defer closeComms(b)
	storeC := rendezvous.NewMemStore()
	c := make([]*comm.Communicator, 2)
	defer func() { // Close is collective: both at once, or Abort what New made
		if c[0] != nil && c[1] != nil {
			if err := closeComms(c); err != nil {
				t.Errorf("closing C: %v", err)
			}
			return
		}
		for _, x := range c {
			if x != nil {
				x.Abort()
			}
		}
	}()
	besidePeerKernel(t, b, coll.OneShotLL, "New of C", func(r int) error {
		cc := besideConfig("new-c")(r)
		cc.Rank, cc.WorldSize, cc.Store = r, 2, storeC
		cc.Device = b[r].Device().Ordinal
		t0 := time.Now()
		var err error
		c[r], err = comm.New(context.Background(), cc)
		t.Logf("rank %d's New of C: %v", r, time.Since(t0))
		return err
	})
	if !t.Failed() {
		if err := checkedAllReduce(c, coll.OneShot, coll.BF16, 3000, 12); err != nil {
			t.Errorf("C's all-reduce: %v", err)
		}
	}
}

// besideConfig is the Config of the groups of TestCloseWhilePeerWaitsGPU
// and TestNewWhilePeerWaitsGPU: generated kernels only, a 20 s deadline.
func besideConfig(group string) func(int) comm.Config {
	return func(int) comm.Config {
		return comm.Config{Library: collectives.Library, DisableNCCL: true, Timeout: 20 * time.Second, Group: group}
	}
}

// besidePeerKernel runs one checked all-reduce of alg on the two ranks of
// b and, beside it, step (named what in errors) on each rank: rank 0
// queues its all-reduce first (its kernel then waits for rank 1) and
// calls step(0) after; rank 1 calls step(1) 100 ms after rank 0's queue,
// and only then its all-reduce. The whole must end well before the
// kernels' 20 s deadline: a step that waits for the context's kernels
// would hold rank 1's call back until then.
func besidePeerKernel(t *testing.T, b []*comm.Communicator, alg coll.Algorithm, what string, step func(r int) error) {
	t.Helper()
	const n = 4096
	ins := [][]byte{input(coll.BF16, n, 9, 0), input(coll.BF16, n, 9, 1)}
	launched := make(chan struct{})
	var once sync.Once // rank 0 closes launched on every path
	signal := func() { once.Do(func() { close(launched) }) }
	var ready sync.WaitGroup // inputs in place: no allocation or copy under the kernel
	ready.Add(2)
	start := time.Now()
	err := ranks(b, func(r int, c *comm.Communicator) error {
		if r == 0 {
			defer signal()
		}
		d := c.Device()
		p, err := d.Alloc(2 * n)
		if err == nil {
			err = d.CopyHtoD(p, ins[r])
		}
		ready.Done()
		if err != nil {
			return err
		}
		defer d.Free(p) // after Synchronize: nothing of this all-reduce in flight
		ready.Wait()
		buf := comm.DeviceBuffer(p)
		run := func() error {
			return c.AllReduce(buf, buf, n, coll.BF16, coll.Sum, comm.Options{Algorithm: alg, Stream: c.Stream()})
		}
		if r == 0 {
			if err := run(); err != nil { // queued; its kernel waits for rank 1
				return err
			}
			signal()
			if err := step(0); err != nil {
				return fmt.Errorf("rank 0's %s: %w", what, err)
			}
		} else {
			<-launched
			time.Sleep(100 * time.Millisecond) // rank 0's kernel is running
			if err := step(1); err != nil {
				return fmt.Errorf("rank 1's %s: %w", what, err)
			}
			if err := run(); err != nil {
				return err
			}
		}
		if err := c.Synchronize(nil); err != nil {
			return fmt.Errorf("rank %d's all-reduce beside the %s: %w", r, what, err)
		}
		got := make([]byte, 2*n)
		if err := d.CopyDtoH(got, p); err != nil {
			return err
		}
		return numeric.Check(coll.BF16, coll.Sum, got, ins)
	})
	took := time.Since(start)
	t.Logf("%s beside the peer's kernel, and the all-reduce: %v", what, took)
	if err != nil {
		t.Fatal(err)
	}
	if took > 10*time.Second {
		t.Errorf("took %v: a %s waited for the peer's kernel (its deadline is 20s)", took, what)
	}
}
