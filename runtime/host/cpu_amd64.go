package host

import "unsafe"

// copyNTBlocks copies n bytes (n > 0, a multiple of 64) to a 16-byte
// aligned dst with non-temporal stores and fences them (copynt_amd64.s).
//
//go:noescape
func copyNTBlocks(dst, src *byte, n uintptr)

// copyNT is copy for destinations nobody will read soon: the bulk goes
// with non-temporal stores, which write whole lines to memory without
// first reading them into the cache (half the memory traffic of an
// ordinary store that misses) and without evicting the data peers are
// about to read. The head up to a 64-byte boundary and the tail go with
// copy. It returns the bytes copied, like copy; dst and src must not
// overlap.
func copyNT(dst, src []byte) int {
	n := min(len(dst), len(src))
	head := min(int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst)))&63), n)
	copy(dst[:head], src[:head])
	body := (n - head) &^ 63
	if body > 0 {
		copyNTBlocks(&dst[head], &src[head], uintptr(body))
	}
	copy(dst[head+body:n], src[head+body:n])
	return n
}

// spinPause is a spin-wait hint for a busy-polling loop (cpu_amd64.s).
func spinPause()
