package kernels

import "testing"

// TestLaunchBlock: blocks of Threads unless MinThreads lets a grid under
// MaxBlocks spread over smaller ones (multiples of 32, never below
// MinThreads, never above Threads).
func TestLaunchBlock(t *testing.T) {
	fixed := Launch{Threads: 256, MaxBlocks: 128}
	adaptive := Launch{Threads: 512, MaxBlocks: 128, MinThreads: 256}
	for _, tc := range []struct {
		l              Launch
		units          int64
		blocks, thread int64
	}{
		{fixed, 1, 1, 256},
		{fixed, 300, 2, 256},
		{fixed, 1 << 20, 128, 256},
		{adaptive, 1, 1, 256},             // small: MinThreads
		{adaptive, 128 * 256, 128, 256},   // fills MaxBlocks at MinThreads
		{adaptive, 128*256 + 1, 114, 288}, // then blocks grow by warps
		{adaptive, 69920, 128, 512},       // 1 MiB reduce-scatter, world 2
		{adaptive, 1 << 22, 128, 512},     // large: Threads
		{Launch{Threads: 512, MaxBlocks: 4, MinThreads: 512}, 100, 1, 512},
	} {
		b, th := tc.l.Block(tc.units)
		if b != tc.blocks || th != tc.thread {
			t.Errorf("%+v.Block(%d) = %d blocks x %d threads, want %d x %d", tc.l, tc.units, b, th, tc.blocks, tc.thread)
		}
		if b*th < min(tc.units, int64(tc.l.MaxBlocks)*th) {
			t.Errorf("%+v.Block(%d): %d x %d threads cannot cover the units in one pass", tc.l, tc.units, b, th)
		}
	}
}
