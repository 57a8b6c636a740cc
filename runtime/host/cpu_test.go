package host

import (
	"bytes"
	"testing"
)

// TestCopyNT checks copyNT against copy for every length up to a few
// vectors past a line, at every alignment of dst and src within a line,
// and for a long copy; the bytes around dst must stay untouched.
func TestCopyNT(t *testing.T) {
	src := make([]byte, 1<<20+256)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	check := func(doff, soff, n int) {
		t.Helper()
		dst := bytes.Repeat([]byte{0xa5}, doff+n+64)
		if got := copyNT(dst[doff:doff+n], src[soff:soff+n+3]); got != n {
			t.Fatalf("dst offset %d, src offset %d, %d bytes: copied %d", doff, soff, n, got)
		}
		if !bytes.Equal(dst[doff:doff+n], src[soff:soff+n]) {
			t.Fatalf("dst offset %d, src offset %d, %d bytes: copy differs", doff, soff, n)
		}
		for _, b := range [][]byte{dst[:doff], dst[doff+n:]} {
			if len(bytes.Trim(b, "\xa5")) != 0 {
				t.Fatalf("dst offset %d, src offset %d, %d bytes: wrote outside dst", doff, soff, n)
			}
		}
	}
	for n := 0; n <= 200; n++ {
		for doff := 0; doff < 64; doff += 3 {
			for _, soff := range []int{0, 1, 8, 17, 64} {
				check(doff, soff, n)
			}
		}
	}
	check(5, 9, 1<<20)
	check(0, 0, 1<<20)
}
