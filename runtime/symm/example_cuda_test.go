//go:build linux && (amd64 || arm64) && cgo

package symm_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"sync"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/symm"
)

// A fused all-reduce plus scale on two GPUs, one goroutine rank each: every
// rank's symmetric buffer holds its input, and a user kernel
// (testdata/allreduce_scale.cu, which includes collgen_symm.cuh) reads all
// peers' buffers through the device pointer array, sums, scales and
// writes, with device barriers before and after. TestCUDAAllReduceScale
// runs the same code and checks the result.
func ExampleCompileKernel() {
	const world, n = 2, 1 << 20
	src, err := os.ReadFile("testdata/allreduce_scale.cu")
	if err != nil {
		panic(err)
	}
	st := rendezvous.NewMemStore()
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			dev, err := cuda.Open(r)
			if err != nil {
				panic(err)
			}
			defer dev.Close()
			be, err := symm.NewCUDABackend(dev, nil)
			if err != nil {
				panic(err)
			}
			defer be.Close()
			pool, err := symm.NewPool(ctx, symm.Config{Group: "allreduce-scale", Rank: r, WorldSize: world, Store: st, Device: r, Backend: be})
			if err != nil {
				panic(err)
			}
			defer pool.Close()
			buf, err := pool.Alloc(4 * n) // n floats of input, written by earlier work
			if err != nil {
				panic(err)
			}
			h, err := pool.Rendezvous(ctx, buf)
			if err != nil {
				panic(err)
			}
			stream, err := dev.NewStream()
			if err != nil {
				panic(err)
			}
			defer stream.Destroy()
			ord, err := be.NewStreamOrdering(stream)
			if err != nil {
				panic(err)
			}
			defer ord.Close()
			mod, err := symm.CompileKernel(ctx, dev, "allreduce_scale.cu", string(src), nil)
			if err != nil {
				panic(err)
			}
			defer mod.Unload()
			out, err := dev.Alloc(4 * n)
			if err != nil {
				panic(err)
			}
			defer dev.Free(out)

			// struct allreduce_scale_args: the group, out, n, scale, first channel.
			group, err := h.KernelGroup(ord, 10*time.Second)
			if err != nil {
				panic(err)
			}
			args := make([]byte, 80)
			copy(args, group)
			binary.LittleEndian.PutUint64(args[56:], uint64(out))
			binary.LittleEndian.PutUint64(args[64:], n)
			binary.LittleEndian.PutUint32(args[72:], math.Float32bits(1.0/world))
			binary.LittleEndian.PutUint32(args[76:], 0) // blocks use channels 0..7
			if err := mod.Launch("allreduce_scale", cuda.Dim3(8), cuda.Dim3(256), 0, stream, args); err != nil {
				panic(err)
			}
			// A silent peer is a *symm.TimeoutError here, not a hang.
			if err := ord.Synchronize(); err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
}
