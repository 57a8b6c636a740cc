//go:build cgo

package cudatest

import "testing"

func TestWorldSize(t *testing.T) {
	for _, c := range []struct {
		env        string
		count, min int
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
	} {
		got, err := worldSize(c.env, c.count, c.min)
		if c.bad {
			if err == nil {
				t.Errorf("worldSize(%q, %d, %d) = %d, want an error", c.env, c.count, c.min, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("worldSize(%q, %d, %d) = %d, %v; want %d", c.env, c.count, c.min, got, err, c.want)
		}
	}
}
