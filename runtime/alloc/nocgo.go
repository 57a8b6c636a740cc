//go:build !cgo

package alloc

// checkDriver has nothing to check without cgo: there is no CUDADriver.
func checkDriver(Driver) error { return nil }
