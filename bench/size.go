package bench

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/collgen/collgen/spec"
)

// ParseSizes parses the --sizes list of every collgen bench: comma-separated
// items, each a positive size in spec syntax ("4MiB", "1000000", "1MB";
// spec.ParseSize) or a doubling range "LO..HI" or "LO-HI" (both ends
// included; "1KiB..256MiB" is 1 KiB, 2 KiB, ..., 256 MiB). A range may name
// its factor: "1KiB..1GiB:x4". The result is sorted and free of duplicates.
func ParseSizes(s string) ([]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty size list; give sizes such as 1KiB..256MiB or 4KiB,1MiB")
	}
	seen := map[int64]bool{}
	var out []int64
	add := func(n int64) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if strings.HasPrefix(item, "-") {
			return nil, fmt.Errorf("bad size %q: sizes are positive", item)
		}
		lo, hi, isRange := strings.Cut(item, "..")
		if !isRange {
			lo, hi, isRange = strings.Cut(item, "-") // bench's --sizes syntax
		}
		if !isRange {
			n, err := parsePositive(item)
			if err != nil {
				return nil, err
			}
			add(n)
			continue
		}
		factor := int64(2)
		if h, f, ok := strings.Cut(hi, ":"); ok {
			hi = h
			f = strings.TrimPrefix(strings.TrimSpace(f), "x")
			if _, err := fmt.Sscanf(f, "%d", &factor); err != nil || factor < 2 || fmt.Sprint(factor) != f {
				return nil, fmt.Errorf("bad range %q: the factor after ':' must be x2, x4, ... (an integer of at least 2)", item)
			}
		}
		a, err := parsePositive(lo)
		if err != nil {
			return nil, err
		}
		b, err := parsePositive(hi)
		if err != nil {
			return nil, err
		}
		if a > b {
			return nil, fmt.Errorf("bad range %q: %s is larger than %s; write the smaller size first", item, lo, hi)
		}
		for n := a; n <= b; n *= factor {
			add(n)
			if n > math.MaxInt64/factor {
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

func parsePositive(s string) (int64, error) {
	n, err := spec.ParseSize(strings.TrimSpace(s))
	if err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, fmt.Errorf("size %q must be positive", s)
	}
	return n, nil
}
