// Command collgen generates specialised collective kernels from a spec, checks
// that checked-in output is fresh, and runs and benchmarks collectives.
package main

import (
	"os"

	"github.com/collgen/collgen/internal/cli"
)

func main() {
	os.Exit(cli.Do(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
