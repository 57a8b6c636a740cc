package bench

import (
	"math/bits"
	"reflect"
	"strings"
	"testing"

	"github.com/collgen/collgen/spec"
)

func TestParseSizes(t *testing.T) {
	cases := []struct {
		in   string
		want []int64
	}{
		{"1KiB..8KiB", []int64{1024, 2048, 4096, 8192}},
		{"1KiB..256MiB", nil}, // length checked below
		{"4MiB,1KiB", []int64{1024, 4 << 20}},
		{"1KiB..64KiB:x4", []int64{1 << 10, 1 << 12, 1 << 14, 1 << 16}},
		{"1KiB..3KiB", []int64{1024, 2048}},
		{"1000, 1KiB..2KiB, 1024", []int64{1000, 1024, 2048}},
		{"1MB", []int64{1000000}},
		{"1KiB-4KiB", []int64{1024, 2048, 4096}},
		{"4KiB,64KiB, 4KiB", []int64{4096, 64 << 10}},
		{"1KiB-64MiB", nil}, // the host bench's default; length checked below
	}
	for _, c := range cases {
		got, err := ParseSizes(c.in)
		if err != nil {
			t.Fatalf("ParseSizes(%q): %v", c.in, err)
		}
		if c.want == nil {
			_, hi, _ := strings.Cut(strings.ReplaceAll(c.in, "..", "-"), "-")
			top, _ := spec.ParseSize(hi)
			if n := bits.Len64(uint64(top)) - 10; len(got) != n || got[0] != 1024 || got[n-1] != top {
				t.Errorf("ParseSizes(%q) = %v, want the %d powers of two from 1KiB to %s", c.in, got, n, hi)
			}
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseSizes(%q) = %v, want %v", c.in, got, c.want)
		}
	}
	for _, bad := range []string{"", "0", "8KiB..1KiB", "1KiB..4KiB:x1", "1KiB..4KiB:y", "1.5MiB", "abc", "1KiB..", "-4", "1KiB-"} {
		if _, err := ParseSizes(bad); err == nil {
			t.Errorf("ParseSizes(%q): want an error", bad)
		}
	}
	// A negative size is named as written, not as the empty left end of a
	// range.
	if _, err := ParseSizes("4KiB,-4KiB"); err == nil || !strings.Contains(err.Error(), `bad size "-4KiB": sizes are positive`) {
		t.Errorf("ParseSizes(-4KiB) = %v", err)
	}
}
