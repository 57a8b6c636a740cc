package nccl_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/nccl"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// A Comm is an io.Closer, as every other runtime handle is.
var _ io.Closer = (*nccl.Comm)(nil)

func TestMissingLibrary(t *testing.T) {
	t.Setenv(nccl.EnvNCCLPath, "/nonexistent/libnccl.so.2")
	err := nccl.OpenForTest()
	var le *nccl.LibraryError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "/nonexistent/libnccl.so.2") {
		t.Fatalf("got %v, want LibraryError naming the path", err)
	}
	t.Log(err)
	t.Setenv(nccl.EnvNCCLPath, "libm.so.6")
	if err := nccl.OpenForTest(); !errors.As(err, &le) || le.Symbol != "ncclGetVersion" {
		t.Fatalf("libm as libnccl: got %v, want missing symbol ncclGetVersion", err)
	}
}

func loadOrSkip(t *testing.T) *nccl.Lib {
	lib, err := nccl.Load()
	if err != nil {
		t.Skipf("NCCL not available: %v", err)
	}
	return lib
}

func TestVersion(t *testing.T) {
	lib := loadOrSkip(t)
	v := lib.Version()
	t.Logf("NCCL %v from %s", v, lib.Path)
	if v.Major != 2 {
		t.Errorf("unexpected version %v", v)
	}
}

func f32(v float32, n int) []byte {
	b := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func checkF32(b []byte, want float32, what string) error {
	for i := 0; i < len(b)/4; i++ {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])); v != want {
			return fmt.Errorf("%s[%d] = %v, want %v", what, i, v, want)
		}
	}
	return nil
}

// rank runs the collectives for one rank of world (goroutine per GPU).
func rank(lib *nccl.Lib, store rendezvous.Store, r, world int, d *cuda.Device) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comm, err := nccl.NewComm(ctx, store, "nccltest", r, world, d)
	if err != nil {
		return err
	}
	defer comm.Close()
	s, err := d.NewStream()
	if err != nil {
		return err
	}
	defer s.Destroy()
	const n = 1 << 20
	send, _ := d.Alloc(4 * n * world)
	recv, _ := d.Alloc(4 * n * world)
	defer d.Free(send)
	defer d.Free(recv)
	host := make([]byte, 4*n*world)
	sumAll := float32(world * (world + 1) / 2)

	// All-reduce sum and max.
	d.CopyHtoD(send, f32(float32(r+1), n))
	if err := comm.AllReduce(send, recv, n, nccl.Float32, nccl.Sum, s); err != nil {
		return err
	}
	s.Synchronize()
	d.CopyDtoH(host[:4*n], recv)
	if err := checkF32(host[:4*n], sumAll, "allreduce sum"); err != nil {
		return err
	}
	if err := comm.AllReduce(send, recv, n, nccl.Float32, nccl.Max, s); err != nil {
		return err
	}
	s.Synchronize()
	d.CopyDtoH(host[:4*n], recv)
	if err := checkF32(host[:4*n], float32(world), "allreduce max"); err != nil {
		return err
	}
	// Reduce-scatter: every rank sends world*n values of r+1; gets n sums.
	d.CopyHtoD(send, f32(float32(r+1), n*world))
	if err := comm.ReduceScatter(send, recv, n, nccl.Float32, nccl.Sum, s); err != nil {
		return err
	}
	s.Synchronize()
	d.CopyDtoH(host[:4*n], recv)
	if err := checkF32(host[:4*n], sumAll, "reducescatter"); err != nil {
		return err
	}
	// All-gather: chunk q of recv is rank q's r+1.
	d.CopyHtoD(send, f32(float32(r+1), n))
	if err := comm.AllGather(send, recv, n, nccl.Float32, s); err != nil {
		return err
	}
	s.Synchronize()
	d.CopyDtoH(host, recv)
	for q := 0; q < world; q++ {
		if err := checkF32(host[4*n*q:4*n*(q+1)], float32(q+1), fmt.Sprintf("allgather chunk %d", q)); err != nil {
			return err
		}
	}
	// FP8 e4m3 all-reduce (NCCL >= 2.24): 1.0 (0x38) summed over world
	// ranks is world, exact in e4m3 up to 8 (1.0 is 0x38, 2.0 0x40, 4.0 0x48, 8.0 0x50).
	e4m3 := map[int]byte{1: 0x38, 2: 0x40, 3: 0x44, 4: 0x48, 5: 0x4a, 6: 0x4c, 7: 0x4e, 8: 0x50}
	if want, ok := e4m3[world]; lib.AtLeast(2, 24) && ok {
		d.Memset8(send, 0x38, 4096)
		if err := comm.AllReduce(send, recv, 4096, nccl.F8E4M3, nccl.Sum, s); err != nil {
			return err
		}
		s.Synchronize()
		d.CopyDtoH(host[:4096], recv)
		if !bytes.Equal(host[:4096], bytes.Repeat([]byte{want}, 4096)) {
			return fmt.Errorf("e4m3 allreduce: got %#x..., want %#x", host[:4], want)
		}
	}
	return comm.AsyncError()
}

// TestCollectivesMultiGPU: every rank's collectives through NCCL, checked
// (one rank when ranks share a GPU: cudatest.NCCLWorld).
func TestCollectivesMultiGPU(t *testing.T) {
	devs := cudatest.Devices(t, cudatest.NCCLWorld(t))
	lib := loadOrSkip(t)
	store := rendezvous.NewMemStore()
	var wg sync.WaitGroup
	errs := make([]error, len(devs))
	for r, d := range devs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = rank(lib, store, r, len(devs), d) }()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
