package cli

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParseAge feeds any text to parseAge, as `collgen cache --prune AGE`
// does: an error, or a non-negative age; whole days ("30d") are 24 h
// each, and an age's Go form (String) reads back as the same age.
func FuzzParseAge(f *testing.F) {
	for _, s := range []string{"720h", "30d", "0d", "0", "-1h", "-0d", "100000d", "100001d", "1.5d", "d", "1h30m", "2562047h",
		"9223372036854775807ns", "+3d", "03d", "1e3h", "1dd", "5d6h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseAge(s)
		if err != nil {
			if d != 0 || !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("%q: %v, error %v", s, d, err)
			}
			return
		}
		if d < 0 {
			t.Fatalf("%q: negative age %v", s, d)
		}
		if n, ok := strings.CutSuffix(s, "d"); ok {
			days, err := strconv.Atoi(n)
			if err != nil || time.Duration(days)*24*time.Hour != d {
				t.Fatalf("%q: %v, not whole days", s, d)
			}
		}
		if d2, err := parseAge(d.String()); err != nil || d2 != d {
			t.Fatalf("%q: %v, whose String %q reads as %v, %v", s, d, d.String(), d2, err)
		}
	})
}
