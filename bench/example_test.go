package bench_test

import (
	"fmt"

	"github.com/collgen/collgen/bench"
)

// One --sizes syntax for every bench: sizes, doubling ranges and a
// range's factor; the result is sorted and free of duplicates.
func ExampleParseSizes() {
	sizes, err := bench.ParseSizes("1KiB..8KiB,4KiB,1MiB..16MiB:x4")
	if err != nil {
		panic(err)
	}
	for _, s := range sizes {
		fmt.Print(bench.FormatBytes(s), " ")
	}
	fmt.Println()
	// Output:
	// 1KiB 2KiB 4KiB 8KiB 1MiB 4MiB 16MiB
}
