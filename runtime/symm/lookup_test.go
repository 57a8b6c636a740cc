//go:build linux && (amd64 || arm64)

package symm

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkLookup10k looks up pointers among 10,000 live allocations (a
// mix of hits at random offsets and misses between allocations). The
// spans are registered directly, at made-up addresses no mapping uses:
// Lookup reads only the registry, and 10,000 real chunks would need 10,000
// descriptors. Run with:
//
//	go test ./runtime/symm -run '^$' -bench Lookup10k -benchmem
func BenchmarkLookup10k(b *testing.B) {
	const n = 10000
	const base, stride, size = uintptr(1) << 40, uintptr(1) << 20, 3 << 18
	bufs := make([]*Buffer, n)
	for i := range bufs {
		bufs[i] = &Buffer{addr: base + uintptr(i)*stride, size: size}
		register(bufs[i])
	}
	defer func() {
		for _, buf := range bufs {
			unregister(buf)
		}
	}()
	rng := rand.New(rand.NewPCG(1, 2))
	ptrs := make([]uintptr, 1024)
	want := make([]bool, len(ptrs))
	for i := range ptrs {
		off := uintptr(rng.IntN(int(stride)))
		ptrs[i] = base + uintptr(rng.IntN(n))*stride + off
		want[i] = off < size
	}
	for i, p := range ptrs {
		if _, _, ok := Lookup(p); ok != want[i] {
			b.Fatalf("Lookup(%#x) = %v, want %v", p, ok, want[i])
		}
	}
	b.ReportAllocs()
	hits, i := 0, 0
	for b.Loop() {
		if _, _, ok := Lookup(ptrs[i&1023]); ok {
			hits++
		}
		i++
	}
	if i >= 1024 && hits == 0 {
		b.Fatal("no hits")
	}
}
