package spec

import "testing"

// FuzzSize: ParseSize never panics and never returns a negative size, and
// FormatSize's text for any non-negative size parses back to it.
func FuzzSize(f *testing.F) {
	for _, s := range []string{"256KiB", "10 MiB", "1.5MiB", "9223372036854775807", "9223372036854775807KiB", "8EiB", " 3 GB ", "-1"} {
		f.Add(s, int64(1)<<20)
	}
	f.Fuzz(func(t *testing.T, s string, n int64) {
		if v, err := ParseSize(s); err == nil && v < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, v)
		}
		if n < 0 {
			n = -(n + 1)
		}
		if v, err := ParseSize(FormatSize(n)); err != nil || v != n {
			t.Fatalf("ParseSize(FormatSize(%d) = %q) = %d, %v", n, FormatSize(n), v, err)
		}
	})
}
