//go:build !amd64

package host

// copyNT is copy (dst and src must not overlap); only amd64 has a
// non-temporal version (copynt_amd64.go).
func copyNT(dst, src []byte) int { return copy(dst, src) }

// spinPause is a spin-wait hint; nothing here (cpu_amd64.s has PAUSE).
func spinPause() {}
