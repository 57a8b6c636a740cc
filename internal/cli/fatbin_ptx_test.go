package cli

import (
	"slices"
	"strings"
	"testing"
)

// The PTX that fatbin adds for GPUs newer than --arch names (the help
// text: "the newest one's PTX, which the driver compiles for newer GPUs")
// is of a plain compute_NN: PTX of an architecture-specific target
// (compute_90a) runs on that architecture only, so a fatbin of
// --arch sm_90a, or of sm_90a,sm_90 (but not sm_90,sm_90a), had no code
// for the next GPU.
func TestGencodePTXIsPortable(t *testing.T) {
	for _, tc := range []struct{ archs, ptx string }{
		{"sm_90", "arch=compute_90,code=compute_90"},
		{"sm_90a", "arch=compute_90,code=compute_90"},
		{"sm_90a,sm_90", "arch=compute_90,code=compute_90"},
		{"sm_90,sm_90a", "arch=compute_90,code=compute_90"},
		{"sm_80 sm_100a", "arch=compute_100,code=compute_100"},
	} {
		flags, err := gencodeFlags(tc.archs)
		if err != nil {
			t.Fatalf("%s: %v", tc.archs, err)
		}
		if got := flags[len(flags)-1]; got != tc.ptx {
			t.Errorf("--arch %s: PTX %s, want %s (flags %s)", tc.archs, got, tc.ptx, strings.Join(flags, " "))
		}
		// The cubins stay as named, suffix and all.
		for _, a := range strings.FieldsFunc(tc.archs, func(r rune) bool { return r == ',' || r == ' ' }) {
			cc := strings.TrimPrefix(a, "sm_")
			if !slices.Contains(flags, "arch=compute_"+cc+",code=sm_"+cc) {
				t.Errorf("--arch %s: no cubin for %s in %s", tc.archs, a, strings.Join(flags, " "))
			}
		}
	}
}
