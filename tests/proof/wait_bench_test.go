package proof

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// BenchmarkSynchronize times a world-1 all-reduce (a device copy) of a
// size that outlasts comm's spin phase, each followed by a wait for it:
// "comm" waits with Communicator.Synchronize, "cuda" with
// cuStreamSynchronize on the same stream. Their difference is what comm's
// abortable wait costs over CUDA's own (docs/performance.md, "Waiting
// for a stream"). One GPU.
func BenchmarkSynchronize(b *testing.B) {
	dev := cudatest.Devices(b, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cm, err := comm.New(ctx, comm.Config{Rank: 0, WorldSize: 1, Device: dev.Ordinal, Store: rendezvous.NewMemStore(),
		Library: collectives.Library, DisableNCCL: true, Group: "bench-sync"})
	if err != nil {
		b.Fatal(err)
	}
	defer cm.Close()
	for _, mib := range []int{1, 64, 256} {
		n := mib << 20 / 4
		in, err := cm.Device().Alloc(4 * n)
		if err != nil {
			b.Fatal(err)
		}
		out, err := cm.Device().Alloc(4 * n)
		if err != nil {
			b.Fatal(err)
		}
		s, err := cm.Device().NewStream()
		if err != nil {
			b.Fatal(err)
		}
		for _, how := range []string{"cuda", "comm"} {
			b.Run(how+"/"+strconv.Itoa(mib)+"MiB", func(b *testing.B) {
				for b.Loop() {
					if err := cm.AllReduce(comm.DeviceBuffer(in), comm.DeviceBuffer(out), n, "f32", "sum", comm.Options{Stream: s}); err != nil {
						b.Fatal(err)
					}
					if how == "cuda" {
						err = s.Synchronize()
					} else {
						err = cm.Synchronize(s)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		s.Destroy()
		cm.Device().Free(in)
		cm.Device().Free(out)
	}
}
