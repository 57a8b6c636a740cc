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
	r, world := comm.Rank(), comm.World()
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

// TestRegisterAndWindows2GPU runs the collectives on plain, registered
// (ncclCommRegister) and window (ncclCommWindowRegister on ncclMemAlloc
// memory, NCCL 2.27+) buffers of non-blocking communicators.
func TestRegisterAndWindows2GPU(t *testing.T) {
	devs := cudatest.Devices(t, 2)
	lib := loadOrSkip(t)
	if !lib.AtLeast(2, 19) {
		t.Skipf("NCCL %v has no buffer registration (2.19+)", lib.Version())
	}
	store := rendezvous.NewMemStore()
	const n = 1 << 20
	err := onRanks(devs, func(r int, d *cuda.Device) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		comm, err := nccl.NewCommConfig(ctx, store, "ncclreg", r, len(devs), d, nccl.Config{Timeout: 30 * time.Second})
		if err != nil {
			return err
		}
		defer comm.Destroy()
		s, err := d.NewStream()
		if err != nil {
			return err
		}
		defer s.Destroy()
		bytes := 4 * n * len(devs)
		send, _ := d.Alloc(bytes)
		recv, _ := d.Alloc(bytes)
		defer d.Free(send)
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
			return err
		}
		if err := collectives(comm, d, s, send, recv, n, "registered"); err != nil {
			return err
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
		if err := collectives(comm, d, s, wsend, wrecv, n, "window"); err != nil {
			return err
		}
		if err := collectives(comm, d, s, wsend, wrecv, 256, "window, 1 KiB"); err != nil {
			return err
		}
		return errors.Join(comm.WindowDeregister(w2), comm.WindowDeregister(w1), comm.AsyncError())
	})
	if err != nil {
		t.Fatal(err)
	}
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

// TestAbortReleasesKernel2GPU: rank 0 issues an all-reduce rank 1 never
// joins, so NCCL's kernel waits for it; Abort from another goroutine stops
// the kernel (the stream drains) and later calls fail with ErrAborted.
func TestAbortReleasesKernel2GPU(t *testing.T) {
	devs := cudatest.Devices(t, 2)
	loadOrSkip(t)
	store := rendezvous.NewMemStore()
	comms := make([]*nccl.Comm, 2)
	if err := onRanks(devs, func(r int, d *cuda.Device) (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		comms[r], err = nccl.NewCommConfig(ctx, store, "abortkernel", r, 2, d, nccl.Config{Timeout: 20 * time.Second})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer comms[1].Destroy()
	d := devs[0]
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	buf, err := d.Alloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(buf)
	if err := comms[0].AllReduce(buf, buf, 1<<20, nccl.Float32, nccl.Sum, s); err != nil {
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
