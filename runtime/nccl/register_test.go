package nccl_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/nccl"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestMissingSymbolNamesVersion: a symbol an older libnccl lacks is an
// error naming the release that has it.
func TestMissingSymbolNamesVersion(t *testing.T) {
	for sym, v := range map[string]string{"ncclCommWindowRegister": "2.27", "ncclCommRegister": "2.19", "ncclMemAlloc": "2.19", "ncclCommInitRankConfig": "2.14"} {
		if msg := nccl.MissingMsg(sym); !strings.Contains(msg, sym) || !strings.Contains(msg, "needs NCCL "+v+" or newer") {
			t.Errorf("%s: %q, want the symbol and NCCL %s", sym, msg, v)
		}
	}
}

// onRanks runs fn for every device concurrently (goroutine ranks).
func onRanks(devs []*cuda.Device, fn func(r int, d *cuda.Device) error) error {
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for r, d := range devs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = fn(r, d) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// collectives runs all-reduce, reduce-scatter and all-gather of n f32 per
// rank on send/recv (each holding world*n) and checks the results.
func collectives(comm *nccl.Comm, d *cuda.Device, s *cuda.Stream, send, recv cuda.DevicePtr, n int, what string) error {
	r, world := comm.Rank(), comm.WorldSize()
	host := make([]byte, 4*n*world)
	sumAll := float32(world * (world + 1) / 2)
	step := func(name string, enqueue func() error, bytes int, check func([]byte) error) error {
		if err := enqueue(); err != nil {
			return fmt.Errorf("%s %s: %w", what, name, err)
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		if err := d.CopyDtoH(host[:bytes], recv); err != nil {
			return err
		}
		if err := check(host[:bytes]); err != nil {
			return fmt.Errorf("%s %s: %w", what, name, err)
		}
		return nil
	}
	d.CopyHtoD(send, f32(float32(r+1), n*world))
	if err := step("allreduce", func() error { return comm.AllReduce(send, recv, n, nccl.Float32, nccl.Sum, s) }, 4*n,
		func(b []byte) error { return checkF32(b, sumAll, "out") }); err != nil {
		return err
	}
	if err := step("reducescatter", func() error { return comm.ReduceScatter(send, recv, n, nccl.Float32, nccl.Sum, s) }, 4*n,
		func(b []byte) error { return checkF32(b, sumAll, "out") }); err != nil {
		return err
	}
	return step("allgather", func() error { return comm.AllGather(send, recv, n, nccl.Float32, s) }, 4*n*world,
		func(b []byte) error {
			for q := 0; q < world; q++ {
				if err := checkF32(b[4*n*q:4*n*(q+1)], float32(q+1), fmt.Sprintf("chunk %d", q)); err != nil {
					return err
				}
			}
			return nil
		})
}

// modes are the two kinds of communicator: blocking (NewComm) and
// non-blocking (NewCommConfig).
var modes = []struct {
	name        string
	nonBlocking bool
}{{"blocking", false}, {"nonblocking", true}}

// newComm makes rank r's communicator of world, blocking or not, its
// initialisation bounded by a minute.
func newComm(store rendezvous.Store, key string, r, world int, d *cuda.Device, nonBlocking bool, timeout time.Duration) (*nccl.Comm, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if nonBlocking {
		return nccl.NewCommConfig(ctx, store, key, r, world, d, nccl.Config{Timeout: timeout})
	}
	return nccl.NewComm(ctx, store, key, r, world, d)
}

// TestRegisterAndWindowsMultiGPU runs the collectives on plain, registered
// (ncclCommRegister) and window (ncclCommWindowRegister on ncclMemAlloc
// memory, NCCL 2.27+) buffers, on blocking and on non-blocking
// communicators. Two window registrations back to back prove that a
// non-blocking call waits for NCCL to finish the operation even when
// NCCL returned ncclSuccess while its background thread still works
// (NCCL 2.28 does so for windows; the next call then failed with "Attempt
// to use communicator before the previous operation returned
// ncclSuccess"), and the windows' handles arrive through C memory.
// One rank when ranks share a GPU (cudatest.NCCLWorld).
func TestRegisterAndWindowsMultiGPU(t *testing.T) {
	devs := cudatest.Devices(t, cudatest.NCCLWorld(t))
	lib := loadOrSkip(t)
	if !lib.AtLeast(2, 19) {
		t.Skipf("NCCL %v has no buffer registration (2.19+)", lib.Version())
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			store := rendezvous.NewMemStore()
			err := onRanks(devs, func(r int, d *cuda.Device) error {
				comm, err := newComm(store, "ncclreg", r, len(devs), d, m.nonBlocking, 30*time.Second)
				if err != nil {
					return err
				}
				defer comm.Close()
				return registerAndWindows(t, lib, comm, d)
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// registerAndWindows is one rank of TestRegisterAndWindowsMultiGPU.
func registerAndWindows(t *testing.T, lib *nccl.Lib, comm *nccl.Comm, d *cuda.Device) error {
	const n = 1 << 20
	s, err := d.NewStream()
	if err != nil {
		return err
	}
	defer s.Destroy()
	bytes := 4 * n * comm.WorldSize()
	send, err := d.Alloc(bytes)
	if err != nil {
		return err
	}
	defer d.Free(send)
	recv, err := d.Alloc(bytes)
	if err != nil {
		return err
	}
	defer d.Free(recv)
	if err := collectives(comm, d, s, send, recv, n, "plain"); err != nil {
		return err
	}
	hs, err := comm.Register(send, bytes)
	if err != nil {
		return err
	}
	hr, err := comm.Register(recv, bytes)
	if err != nil {
		return errors.Join(err, comm.Deregister(hs))
	}
	if err := collectives(comm, d, s, send, recv, n, "registered"); err != nil {
		return errors.Join(err, comm.Deregister(hs), comm.Deregister(hr))
	}
	if err := errors.Join(comm.Deregister(hs), comm.Deregister(hr)); err != nil {
		return err
	}
	if !lib.AtLeast(2, 27) {
		t.Logf("NCCL %v: no windows (2.27+), skipping that part", lib.Version())
		return comm.AsyncError()
	}
	wsend, err := lib.MemAlloc(d, bytes)
	if err != nil {
		return err
	}
	defer lib.MemFree(d, wsend)
	wrecv, err := lib.MemAlloc(d, bytes)
	if err != nil {
		return err
	}
	defer lib.MemFree(d, wrecv)
	w1, err := comm.WindowRegister(wsend, bytes, nccl.WindowSymmetric)
	if err != nil {
		return err
	}
	w2, err := comm.WindowRegister(wrecv, bytes, nccl.WindowSymmetric)
	if err != nil {
		return err
	}
	if w1 == 0 || w2 == 0 || w1 == w2 {
		return fmt.Errorf("rank %d: windows %#x and %#x, want two distinct handles", comm.Rank(), uintptr(w1), uintptr(w2))
	}
	if err := collectives(comm, d, s, wsend, wrecv, n, "window"); err != nil {
		return err
	}
	if err := collectives(comm, d, s, wsend, wrecv, 256, "window, 1 KiB"); err != nil {
		return err
	}
	return errors.Join(comm.WindowDeregister(w2), comm.WindowDeregister(w1), comm.AsyncError())
}

// TestInitBounded: a non-blocking communicator whose peer never joins
// fails when the context ends (ErrTimeout), aborted, instead of hanging.
func TestInitBounded(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	loadOrSkip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err := nccl.NewCommConfig(ctx, rendezvous.NewMemStore(), "lonely", 0, 2, d, nccl.Config{})
	el := time.Since(start)
	if !errors.Is(err, nccl.ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	if el > 20*time.Second {
		t.Errorf("took %v for a 3 s bound", el)
	}
	t.Logf("%v after %v", err, el)
}

// TestAbortReleasesKernelMultiGPU: every rank runs an all-reduce (NCCL
// sets up its connections in the first one), then rank 0 issues the same
// all-reduce alone, so the call returns and NCCL's kernel waits for the
// others; Abort from another goroutine stops the kernel (the stream
// drains) and later calls fail with ErrAborted. For blocking and
// non-blocking communicators.
func TestAbortReleasesKernelMultiGPU(t *testing.T) {
	cudatest.OwnGPUs(t)
	devs := cudatest.World(t, 2)
	loadOrSkip(t)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { abortReleasesKernel(t, devs, m.nonBlocking) })
	}
}

func abortReleasesKernel(t *testing.T, devs []*cuda.Device, nonBlocking bool) {
	const n = 1 << 20
	store := rendezvous.NewMemStore()
	comms := make([]*nccl.Comm, len(devs))
	streams := make([]*cuda.Stream, len(devs))
	bufs := make([]cuda.DevicePtr, len(devs))
	t.Cleanup(func() {
		for r := range comms {
			if comms[r] != nil {
				comms[r].Abort()
			}
			if streams[r] != nil {
				streams[r].Destroy()
			}
			if bufs[r] != 0 {
				devs[r].Free(bufs[r])
			}
		}
	})
	if err := onRanks(devs, func(r int, d *cuda.Device) (err error) {
		if comms[r], err = newComm(store, "abortkernel", r, len(devs), d, nonBlocking, 20*time.Second); err != nil {
			return err
		}
		if streams[r], err = d.NewStream(); err != nil {
			return err
		}
		if bufs[r], err = d.Alloc(4 * n); err != nil {
			return err
		}
		if err := comms[r].AllReduce(bufs[r], bufs[r], n, nccl.Float32, nccl.Sum, streams[r]); err != nil {
			return err
		}
		return streams[r].Synchronize()
	}); err != nil {
		t.Fatal(err)
	}
	s, buf := streams[0], bufs[0]
	if err := comms[0].AllReduce(buf, buf, n, nccl.Float32, nccl.Sum, s); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if done, err := s.Query(); done || err != nil {
		t.Fatalf("the all-reduce finished without its peer (done %v, %v)", done, err)
	}
	aborted := make(chan error, 1)
	start := time.Now()
	go func() { aborted <- comms[0].Abort() }()
	for {
		done, err := s.Query()
		if done || err != nil {
			t.Logf("stream drained after Abort in %v (%v)", time.Since(start), err)
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatal("the NCCL kernel still runs 20 s after Abort")
		}
		time.Sleep(time.Millisecond)
	}
	if err := <-aborted; err != nil {
		t.Logf("Abort: %v", err)
	}
	if err := comms[0].AllReduce(buf, buf, 16, nccl.Float32, nccl.Sum, s); !errors.Is(err, nccl.ErrAborted) {
		t.Errorf("call after Abort: %v, want ErrAborted", err)
	}
}
