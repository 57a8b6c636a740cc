package bench

import (
	"slices"
	"testing"
)

// FuzzParseSizes: any --sizes string gives sorted, distinct, positive
// sizes or an error, never a panic and never an endless list (a range
// "1..9EiB:x2" is 63 sizes at most).
func FuzzParseSizes(f *testing.F) {
	for _, s := range []string{"1KiB..256MiB", "4KiB,1MiB", "1KiB-1GiB:x4", "1..9223372036854775807:x2", "0", "-1", "5..3", "1KiB..1KiB:x1", "1KiB..2KiB:x99999999999999999999", ","} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sizes, err := ParseSizes(s)
		if err != nil {
			return
		}
		if len(sizes) == 0 || len(sizes) > 10000 {
			t.Fatalf("ParseSizes(%q): %d sizes", s, len(sizes))
		}
		if !slices.IsSorted(sizes) || len(slices.Compact(slices.Clone(sizes))) != len(sizes) || sizes[0] <= 0 {
			t.Fatalf("ParseSizes(%q) = %v: want sorted, distinct, positive", s, sizes)
		}
	})
}
