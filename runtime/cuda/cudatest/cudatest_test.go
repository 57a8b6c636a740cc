//go:build cgo

package cudatest

import "testing"

func TestWorldSize(t *testing.T) {
	for _, c := range []struct {
		env        string
		count, min int
		shared     bool
		want       int
		bad        bool
	}{
		{env: "", count: 4, min: 2, want: 4},
		{env: "", count: 8, min: 2, want: 8},
		{env: "", count: 1, min: 2, want: 2}, // Devices then skips: 2 needed, 1 found
		{env: "3", count: 4, min: 2, want: 3},
		{env: "8", count: 4, min: 2, want: 8}, // Devices skips
		{env: "1", count: 4, min: 2, bad: true},
		{env: "four", count: 4, min: 2, bad: true},
		{env: "", count: 1, min: 2, shared: true, want: 2},  // every rank on GPU 0
		{env: "", count: 8, min: 2, shared: true, want: 2},  // not every GPU: one is used
		{env: "4", count: 1, min: 2, shared: true, want: 4}, // any world on one GPU
		{env: "1", count: 1, min: 2, shared: true, bad: true},
	} {
		got, err := worldSize(c.env, c.count, c.min, c.shared)
		if c.bad {
			if err == nil {
				t.Errorf("worldSize(%q, %d, %d, %v) = %d, want an error", c.env, c.count, c.min, c.shared, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("worldSize(%q, %d, %d, %v) = %d, %v; want %d", c.env, c.count, c.min, c.shared, got, err, c.want)
		}
	}
}

// TestSharedPlacement: with $COLLGEN_TEST_SHARE_GPU=1 every rank is on GPU
// 0 and any number of ranks needs one GPU; unset, rank r is on GPU r.
func TestSharedPlacement(t *testing.T) {
	t.Setenv(EnvShare, "")
	if Shared() || Ordinal(3) != 3 || distinct(4) != 4 {
		t.Errorf("unshared: Shared %v, Ordinal(3) %d, distinct(4) %d", Shared(), Ordinal(3), distinct(4))
	}
	t.Setenv(EnvShare, "1")
	if !Shared() || Ordinal(3) != 0 || distinct(4) != 1 || distinct(0) != 0 {
		t.Errorf("shared: Shared %v, Ordinal(3) %d, distinct(4) %d, distinct(0) %d", Shared(), Ordinal(3), distinct(4), distinct(0))
	}
}
