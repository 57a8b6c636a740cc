//go:build cgo && linux && (amd64 || arm64)

package comm

import (
	"context"
	"math"
	"testing"

	"github.com/collgen/collgen/runtime/cuda"
)

// TestCUDALookupHugeCount: cudaDevice.lookup counts the n bytes at p as
// symmetric only when they lie in the buffer. A call's input bytes reach
// it unbounded by anything but int64 (a DeviceBuffer has no length: an
// f32 all-reduce of 2^61-1 elements passes the front end with
// 2^63-4 bytes), so offset+n must not wrap negative and pass. It runs on
// the CPU: the device's lookup needs only symm's registry, which a
// host-twin pool's buffers join too.
func TestCUDALookupHugeCount(t *testing.T) {
	pool := hostPools(t, "lookuphuge", 1)[0]
	b, err := pool.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Rendezvous(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	d := &cudaDevice{}
	d.addSymmetric(pool)
	p := cuda.DevicePtr(b.Addr() + 256)
	for _, tc := range []struct {
		n    int64
		want bool
	}{
		{4096 - 256, true},
		{4096 - 255, false},
		{math.MaxInt64 - 3, false},
		{math.MaxInt64, false},
	} {
		if zc, ok := d.lookup(p, tc.n); ok != tc.want {
			t.Errorf("lookup(buffer+256, %d) = %+v, %v; want %v (the buffer has 4096 bytes)", tc.n, zc, ok, tc.want)
		}
	}
}
