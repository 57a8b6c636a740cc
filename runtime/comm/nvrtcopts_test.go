//go:build cgo && linux && (amd64 || arm64)

package comm

import (
	"slices"
	"testing"
)

// TestNVRTCOptions: -minimal from NVRTC 12.4 on (older ones refuse it as an
// unknown option), $COLLGEN_NVRTC_OPTIONS appended, an option given twice
// kept once.
func TestNVRTCOptions(t *testing.T) {
	for _, c := range []struct {
		major, minor int
		env          string
		want         []string
	}{
		{11, 8, "", []string{"--std=c++17"}},
		{12, 3, "", []string{"--std=c++17"}},
		{12, 4, "", []string{"--std=c++17", "-minimal"}},
		{13, 0, "", []string{"--std=c++17", "-minimal"}},
		{13, 0, " -minimal  -lineinfo ", []string{"--std=c++17", "-minimal", "-lineinfo"}},
		{11, 8, "-lineinfo -lineinfo", []string{"--std=c++17", "-lineinfo"}},
		{0, 0, "", []string{"--std=c++17"}},
	} {
		if got := nvrtcOptionsFor(c.major, c.minor, c.env); !slices.Equal(got, c.want) {
			t.Errorf("NVRTC %d.%d, env %q: %q, want %q", c.major, c.minor, c.env, got, c.want)
		}
	}
}
