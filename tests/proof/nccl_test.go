package proof

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/alloc"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/nccl"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// ncclModes are the ways comm opens its NCCL communicator: blocking (the
// default) and Config.NCCLNonBlocking.
var ncclModes = []struct {
	name        string
	nonBlocking bool
}{{"blocking", false}, {"nonblocking", true}}

// ranks runs fn on every rank concurrently.
func ranks(comms []*comm.Communicator, fn func(r int, c *comm.Communicator) error) error {
	return errors.Join(rankErrs(comms, fn)...)
}

// rankErrs runs fn for every rank at once, as ranks does, and returns each
// rank's error (nil where it succeeded), for tests that check them one by
// one.
func rankErrs(comms []*comm.Communicator, fn func(r int, c *comm.Communicator) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = fn(r, c) }()
	}
	wg.Wait()
	return errs
}

// checkedAllReduce runs one in-place sum all-reduce of n elements of dt
// on every rank with algorithm alg, inputs from seed, and checks every
// rank's result.
func checkedAllReduce(comms []*comm.Communicator, alg coll.Algorithm, dt coll.DType, n, seed int) error {
	ins := make([][]byte, len(comms))
	for r := range ins {
		ins[r] = input(dt, n, seed, r)
	}
	return ranks(comms, func(r int, c *comm.Communicator) error {
		d := c.Device()
		bytes := n * dt.Size()
		p, err := d.Alloc(bytes)
		if err != nil {
			return err
		}
		defer d.Free(p)
		if err := d.CopyHtoD(p, ins[r]); err != nil {
			return err
		}
		b := comm.DeviceBuffer(p)
		if err := c.AllReduce(b, b, n, dt, coll.Sum, comm.Options{Algorithm: alg}); err != nil {
			return err
		}
		got := make([]byte, bytes)
		if err := d.CopyDtoH(got, p); err != nil {
			return err
		}
		if err := numeric.Check(dt, coll.Sum, got, ins); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		return nil
	})
}

// ncclCollectives runs the three collectives through NCCL (forced) on
// ins/outs (by rank, n bf16 per rank; each buffer holds world*n, the
// all-reduce's count and the all-gather's output) and checks them.
func ncclCollectives(comms []*comm.Communicator, ins, outs []cuda.DevicePtr, n int, what string) error {
	const dt = coll.BF16
	w := len(comms)
	srcs := make([][]byte, w)
	for r := range srcs {
		srcs[r] = input(dt, w*n, 31, r)
	}
	return ranks(comms, func(r int, c *comm.Communicator) error {
		d := c.Device()
		if err := d.CopyHtoD(ins[r], srcs[r]); err != nil {
			return err
		}
		o := comm.Options{Algorithm: coll.NCCL}
		in, out := comm.DeviceBuffer(ins[r]), comm.DeviceBuffer(outs[r])
		got := make([]byte, 2*w*n)
		// All-reduce of w*n elements.
		if err := c.AllReduce(in, out, w*n, dt, coll.Sum, o); err != nil {
			return fmt.Errorf("%s allreduce: %w", what, err)
		}
		d.CopyDtoH(got, outs[r])
		if err := numeric.Check(dt, coll.Sum, got, srcs); err != nil {
			return fmt.Errorf("%s allreduce, rank %d: %w", what, r, err)
		}
		// Reduce-scatter: rank r gets elements [r*n, (r+1)*n).
		if err := c.ReduceScatter(in, out, n, dt, coll.Sum, o); err != nil {
			return fmt.Errorf("%s reducescatter: %w", what, err)
		}
		d.CopyDtoH(got[:2*n], outs[r])
		part := make([][]byte, len(srcs))
		for q := range srcs {
			part[q] = srcs[q][2*n*r : 2*n*(r+1)]
		}
		if err := numeric.Check(dt, coll.Sum, got[:2*n], part); err != nil {
			return fmt.Errorf("%s reducescatter, rank %d: %w", what, r, err)
		}
		// All-gather of n elements per rank.
		if err := c.AllGather(in, out, n, dt, o); err != nil {
			return fmt.Errorf("%s allgather: %w", what, err)
		}
		d.CopyDtoH(got, outs[r])
		for q := range srcs {
			if !bytesEqual(got[2*n*q:2*n*(q+1)], srcs[q][:2*n]) {
				return fmt.Errorf("%s allgather, rank %d: chunk %d differs", what, r, q)
			}
		}
		return nil
	})
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// TestNCCLRegistrationGPU runs NCCL collectives on allocator blocks (every
// segment registered through Config.Allocator) and on NCCL windows
// (ncclMemAlloc memory, RegisterWindow; NCCL 2.27+), small and large; and
// checks that memory NCCL cannot register is refused at registration. With
// blocking and non-blocking NCCL communicators.
func TestNCCLRegistrationGPU(t *testing.T) {
	cudatest.OwnGPUs(t) // a one-rank communicator has no NCCL (it copies)
	lib, err := nccl.Load()
	if err != nil {
		t.Skipf("NCCL: %v", err)
	}
	if !lib.AtLeast(2, 19) {
		t.Skipf("NCCL %v has no registration (2.19+)", lib.Version())
	}
	for _, m := range ncclModes {
		t.Run(m.name, func(t *testing.T) { ncclRegistration(t, lib, m.nonBlocking) })
	}
}

func ncclRegistration(t *testing.T, lib *nccl.Lib, nonBlocking bool) {
	var err error
	w := cudatest.WorldSize(t, 2)
	devs := make([]*cuda.Device, w)
	allocs := make([]*alloc.Allocator, w)
	for r := range devs {
		if devs[r], err = cuda.Open(cudatest.Ordinal(r)); err != nil {
			t.Fatal(err)
		}
		defer devs[r].Close()
		if allocs[r], err = alloc.NewCUDA(devs[r], alloc.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	// A segment before New: registered at New.
	early, err := allocs[0].Alloc(1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	comms := commsWith(t, w, rendezvous.NewMemStore(), func(r int) comm.Config {
		return comm.Config{Group: "ncclreg", Allocator: allocs[r], Timeout: 20 * time.Second, NCCLNonBlocking: nonBlocking}
	})
	defer closeComms(comms)
	for _, n := range []int{512, 16 << 20} { // 1 KiB and 32 MiB of bf16 per rank
		ins, outs := make([]cuda.DevicePtr, w), make([]cuda.DevicePtr, w)
		var blocks []*alloc.Block
		for r := range comms {
			bi, err1 := allocs[r].Alloc(int64(2*w*n), comms[r].Stream())
			bo, err2 := allocs[r].Alloc(int64(2*w*n), comms[r].Stream())
			if err := errors.Join(err1, err2); err != nil {
				t.Fatal(err)
			}
			blocks = append(blocks, bi, bo)
			ins[r], outs[r] = bi.Ptr(), bo.Ptr()
		}
		if err := ncclCollectives(comms, ins, outs, n, fmt.Sprintf("registered, %d bf16", n)); err != nil {
			t.Error(err)
		}
		for i, b := range blocks {
			allocs[i/2].Free(b) // two blocks per rank, in rank order
		}
	}
	allocs[0].Free(early)
	// Freeing segments deregisters them first (a failure would show here
	// or in Close).
	for _, a := range allocs {
		if err := a.EmptyCache(); err != nil {
			t.Error(err)
		}
	}
	// Refusals at registration.
	host, err := devs[0].HostAlloc(4096, true)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Free()
	goMem := make([]byte, 4096)
	type refusal struct {
		p     cuda.DevicePtr
		bytes int64
		want  string
	}
	refusals := []refusal{{host.DevPtr, 4096, "host memory"}, {0x10, 4096, "not memory the CUDA driver knows"}, {cuda.DevicePtr(unsafe.Pointer(&goMem[0])), 4096, "not memory the CUDA driver knows"}}
	// A growable address range (reliability case 11; PyTorch's expandable
	// segments): a VMM reservation of two granules with the first mapped.
	// A range running into the unmapped rest, or starting there, is refused.
	if ok, _ := devs[0].VMMSupported(); ok {
		va := growableVA(t, devs[0])
		g := va.granule
		refusals = append(refusals, refusal{va.base, 2 * g, "runs past its allocation"}, refusal{va.base + cuda.DevicePtr(g), g, "not memory the CUDA driver knows"})
	}
	for _, c := range refusals {
		if err := comms[0].RegisterBuffer(c.p, c.bytes); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("register %#x (%d bytes): %v, want ErrInvalidArgument saying %q", uintptr(c.p), c.bytes, err, c.want)
		}
	}
	if !lib.AtLeast(2, 27) {
		t.Logf("NCCL %v: no windows (2.27+)", lib.Version())
		return
	}
	const n = 4 << 20
	bytes := 2 * w * n
	ins, outs := make([]cuda.DevicePtr, w), make([]cuda.DevicePtr, w)
	for r := range comms {
		if ins[r], err = lib.MemAlloc(devs[r], bytes); err != nil {
			t.Fatal(err)
		}
		defer lib.MemFree(devs[r], ins[r])
		if outs[r], err = lib.MemAlloc(devs[r], bytes); err != nil {
			t.Fatal(err)
		}
		defer lib.MemFree(devs[r], outs[r])
	}
	ctx := context.Background()
	if err := ranks(comms, func(r int, c *comm.Communicator) error {
		return errors.Join(c.RegisterWindow(ctx, ins[r], int64(bytes)), c.RegisterWindow(ctx, outs[r], int64(bytes)))
	}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []int{512, n} {
		if err := ncclCollectives(comms, ins, outs, m, fmt.Sprintf("window, %d bf16", m)); err != nil {
			t.Error(err)
		}
	}
	if err := ranks(comms, func(r int, c *comm.Communicator) error {
		return errors.Join(c.DeregisterWindow(ctx, outs[r]), c.DeregisterWindow(ctx, ins[r]))
	}); err != nil {
		t.Error(err)
	}
}

// TestAbortGPU: rank 0 runs a generated kernel that waits for the other
// ranks, which never call; Abort from another goroutine returns ErrAborted from
// the call long before the kernel's deadline (the barrier kernel through
// its signal pad, the LL kernel through the abort word). Then a new group
// on a fresh store works.
func TestAbortGPU(t *testing.T) {
	w := cudatest.WorldSize(t, 2)
	for _, alg := range []coll.Algorithm{coll.OneShot, coll.OneShotLL} {
		t.Run(string(alg), func(t *testing.T) {
			const timeout = 60 * time.Second
			comms := commsWith(t, w, rendezvous.NewMemStore(), func(int) comm.Config {
				return comm.Config{Group: "abort", Timeout: timeout}
			})
			dev := comms[0].Device()
			buf := deviceMem(t, dev, 1<<20)
			defer dev.Free(buf)
			res := make(chan error, 1)
			go func() {
				b := comm.DeviceBuffer(buf)
				res <- comms[0].AllReduce(b, b, 1024, coll.F32, coll.Sum, comm.Options{Algorithm: alg})
			}()
			time.Sleep(time.Second)
			start := time.Now()
			// A call still blocked 10 s after Abort shows where it waits.
			stuck := stacksAfter(t, 10*time.Second, "the call is still blocked 10s after Abort")
			aerr := comms[0].Abort()
			abortTook := time.Since(start)
			err := <-res
			stuck.Stop()
			el := time.Since(start)
			t.Logf("Abort returned after %v", abortTook)
			if !errors.Is(err, comm.ErrAborted) {
				t.Errorf("blocked call: %v, want ErrAborted", err)
			}
			if el > 10*time.Second {
				t.Errorf("Abort took %v to release the call (kernel deadline %v)", el, timeout)
			}
			if aerr != nil {
				t.Errorf("Abort: %v", aerr)
			}
			t.Logf("released after %v: %v", el, err)
			if err := comms[0].AllReduce(comm.DeviceBuffer(buf), comm.DeviceBuffer(buf), 16, coll.F32, coll.Sum, comm.Options{}); !errors.Is(err, comm.ErrAborted) {
				t.Errorf("after Abort: %v", err)
			}
			for _, c := range comms[1:] {
				c.Abort()
			}
			fresh := commsWith(t, w, rendezvous.NewMemStore(), func(int) comm.Config { return comm.Config{Group: "abort"} })
			defer closeComms(fresh)
			if err := checkedAllReduce(fresh, alg, coll.F32, 1024, 5); err != nil {
				t.Errorf("a new communicator after Abort: %v", err)
			}
		})
	}
}

// TestNCCLAllocWindowsGPU: with Config.NCCLWindows, buffers from
// Communicator.Alloc (symmetric VMM memory) are registered as NCCL windows
// (NCCL 2.27+); NCCL collectives on them, small and large, are right.
// With blocking and non-blocking NCCL communicators.
func TestNCCLAllocWindowsGPU(t *testing.T) {
	cudatest.OwnGPUs(t)
	lib, err := nccl.Load()
	if err != nil {
		t.Skipf("NCCL: %v", err)
	}
	if !lib.AtLeast(2, 27) {
		t.Skipf("NCCL %v has no windows (2.27+)", lib.Version())
	}
	for _, m := range ncclModes {
		t.Run(m.name, func(t *testing.T) { ncclAllocWindows(t, m.nonBlocking) })
	}
}

func ncclAllocWindows(t *testing.T, nonBlocking bool) {
	comms := commsWith(t, cudatest.WorldSize(t, 2), rendezvous.NewMemStore(), func(int) comm.Config {
		return comm.Config{Group: "ncclwin", Timeout: 20 * time.Second, NCCLWindows: true, NCCLNonBlocking: nonBlocking}
	})
	defer closeComms(comms)
	const n = 8 << 20
	w := len(comms)
	ins, outs := make([]cuda.DevicePtr, w), make([]cuda.DevicePtr, w)
	if err := ranks(comms, func(r int, c *comm.Communicator) (err error) {
		if ins[r], err = c.Alloc(context.Background(), 2*w*n); err != nil {
			return err
		}
		outs[r], err = c.Alloc(context.Background(), 2*w*n)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []int{512, n} {
		if err := ncclCollectives(comms, ins, outs, m, fmt.Sprintf("Alloc window, %d bf16", m)); err != nil {
			t.Error(err)
		}
	}
}

// growable is a VMM reservation of two granules whose first is mapped and
// accessible, the rest reserved only (as a growing segment's tail).
type growable struct {
	base    cuda.DevicePtr
	granule int64
}

// growableVA makes a growable range on dev, undone at the test's end.
func growableVA(t *testing.T, dev *cuda.Device) growable {
	t.Helper()
	g, err := dev.MemGranularity(false)
	if err != nil {
		t.Fatal(err)
	}
	va, err := dev.MemAddressReserve(2*g, g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.MemAddressFree(va, 2*g) })
	h, err := dev.MemCreate(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.MemRelease(h) })
	if err := dev.MemMap(va, g, h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.MemUnmap(va, g) })
	if err := dev.MemSetAccess(va, g, dev); err != nil {
		t.Fatal(err)
	}
	return growable{va, int64(g)}
}

// TestNCCLFirstCallAbsentPeerGPU (the open part of reliability case 9):
// with Config.NCCLNonBlocking, a first NCCL collective whose peer never
// calls (NCCL sets up its connections inside that call, waiting for the
// peer) ends with ErrTimeout or ErrAborted within Config.Timeout plus
// slack. The default blocking communicator waits inside that NCCL call
// without a bound (docs/reliability.md), so only non-blocking runs here;
// whether it becomes the default waits for its NCCL rows measured against
// the blocking one's on 2 x H200 (collgen bench --nccl-nonblocking).
func TestNCCLFirstCallAbsentPeerGPU(t *testing.T) {
	cudatest.OwnGPUs(t)
	atLeast(t, 2)
	if _, err := nccl.Load(); err != nil {
		t.Skipf("NCCL: %v", err)
	}
	const timeout = 5 * time.Second
	comms := commsWith(t, 2, rendezvous.NewMemStore(), func(int) comm.Config {
		return comm.Config{Group: "nccl-first-absent", Timeout: timeout, NCCLNonBlocking: true}
	})
	defer func() {
		for _, c := range comms {
			c.Abort()
		}
	}()
	dev := comms[0].Device()
	buf := deviceMem(t, dev, 4<<20)
	defer dev.Free(buf)
	start := time.Now()
	res := make(chan error, 1)
	go func() {
		b := comm.DeviceBuffer(buf)
		res <- comms[0].AllReduce(b, b, 1<<20, coll.F32, coll.Sum, comm.Options{Algorithm: coll.NCCL})
	}()
	select {
	case err := <-res:
		el := time.Since(start)
		t.Logf("rank 0's first NCCL all-reduce alone: %v after %v", err, el)
		if !errors.Is(err, comm.ErrTimeout) && !errors.Is(err, comm.ErrAborted) {
			t.Errorf("the first NCCL all-reduce without its peer: %v, want ErrTimeout or ErrAborted", err)
		}
		if el > timeout+10*time.Second {
			t.Errorf("it returned after %v (Config.Timeout %v)", el, timeout)
		}
	case <-time.After(timeout + 30*time.Second):
		t.Fatalf("the first NCCL all-reduce without its peer still waits %v after its start (Config.Timeout %v)", time.Since(start), timeout)
	}
}
