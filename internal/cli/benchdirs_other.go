//go:build !linux

package cli

// benchDirPrefix starts the name of the directory of a bench's rank
// processes.
func benchDirPrefix() string { return "collgen-bench-" }

// sweepBenchDirs has nothing to tell dead benches by here.
func sweepBenchDirs(dir string) {}
