package nccl_test

import (
	"context"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/nccl"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// BenchmarkEagerCall times one 1 KiB all-reduce on a world-1 communicator,
// enqueued and waited for (cuStreamSynchronize), blocking and
// non-blocking: what a non-blocking communicator's wait for NCCL's
// background thread adds per call (docs/registration.md, "Non-blocking
// NCCL"). One GPU.
func BenchmarkEagerCall(b *testing.B) {
	dev := cudatest.Devices(b, 1)[0]
	if _, err := nccl.Load(); err != nil {
		b.Skipf("NCCL not available: %v", err)
	}
	for _, nonBlocking := range []bool{false, true} {
		name := "blocking"
		if nonBlocking {
			name = "nonblocking"
		}
		b.Run(name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var c *nccl.Comm
			var err error
			if nonBlocking {
				c, err = nccl.NewCommConfig(ctx, rendezvous.NewMemStore(), "bench", 0, 1, dev, nccl.Config{})
			} else {
				c, err = nccl.NewComm(ctx, rendezvous.NewMemStore(), "bench", 0, 1, dev)
			}
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			s, err := dev.NewStream()
			if err != nil {
				b.Fatal(err)
			}
			defer s.Destroy()
			const n = 256
			buf, err := dev.Alloc(4 * n)
			if err != nil {
				b.Fatal(err)
			}
			defer dev.Free(buf)
			for b.Loop() {
				if err := c.AllReduce(buf, buf, n, nccl.Float32, nccl.Sum, s); err != nil {
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
