package spec

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the size suffixes ParseSize accepts, longest first.
var sizeUnits = []struct {
	name string
	mult int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
	{"B", 1},
}

// sizeUnitNames lists the accepted units, for messages.
const sizeUnitNames = "B, KiB, MiB, GiB, KB, MB, GB"

// ErrSizeTooLarge is the error ParseSize wraps for a size beyond what an
// int64 holds.
var ErrSizeTooLarge = errors.New("the limit is 2^63-1 bytes")

// ParseSize parses a byte count: a non-negative integer optionally followed
// (with or without one space) by a unit B, KiB, MiB, GiB (powers of 1024) or
// KB, MB, GB (powers of 1000), as in "256KiB" or "10 MiB". Units are case
// sensitive. The error says what to write instead.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	num, unit := t[:i], strings.TrimPrefix(t[i:], " ")
	if num == "" {
		return 0, fmt.Errorf("bad size %q: want bytes as an integer or an integer with a unit (%s), e.g. 256KiB", s, sizeUnitNames)
	}
	if strings.HasPrefix(unit, ".") {
		j := 1
		for j < len(unit) && unit[j] >= '0' && unit[j] <= '9' {
			j++
		}
		hint := "1536KiB for 1.5MiB"
		f, err := strconv.ParseFloat(num+unit[:j], 64)
		u := strings.TrimPrefix(unit[j:], " ")
		for _, su := range sizeUnits {
			if err == nil && u == su.name && f*float64(su.mult) < 1<<62 && f*float64(su.mult) == math.Trunc(f*float64(su.mult)) {
				hint = FormatSize(int64(f*float64(su.mult))) + " for " + t
			}
		}
		return 0, fmt.Errorf("bad size %q: sizes are whole numbers; use a smaller unit, e.g. %s", s, hint)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q is too large (%w)", s, ErrSizeTooLarge)
	}
	mult := int64(0)
	for _, u := range sizeUnits {
		if unit == u.name {
			mult = u.mult
		}
	}
	if unit == "" {
		mult = 1
	}
	// Units beyond GiB and GB: say how to write the size with those.
	for _, u := range []struct {
		name, to    string
		per, toMult int64
	}{{"TiB", "GiB", 1 << 10, 1 << 30}, {"PiB", "GiB", 1 << 20, 1 << 30}, {"EiB", "GiB", 1 << 30, 1 << 30},
		{"TB", "GB", 1e3, 1e9}, {"PB", "GB", 1e6, 1e9}, {"EB", "GB", 1e9, 1e9}} {
		if unit != u.name {
			continue
		}
		if n > math.MaxInt64/u.toMult/u.per {
			return 0, fmt.Errorf("size %q is too large (%w)", s, ErrSizeTooLarge)
		}
		return 0, fmt.Errorf("bad size %q: the largest unit is %s; write %d%s", s, u.to, n*u.per, u.to)
	}
	if mult == 0 {
		var names []string
		for _, u := range sizeUnits {
			names = append(names, u.name)
		}
		hint := ""
		if sg := suggest(unit, names); sg != "" {
			hint = fmt.Sprintf("; did you mean %s%s?", num, sg)
		}
		return 0, fmt.Errorf("bad size %q: unknown unit %q%s (units: %s)", s, unit, hint, sizeUnitNames)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large (%w)", s, ErrSizeTooLarge)
	}
	return n * mult, nil
}

// FormatSize formats n bytes with the largest binary unit that divides it
// exactly ("256KiB", "10MiB", "1000B"), the inverse of ParseSize.
func FormatSize(n int64) string {
	switch {
	case n == 0:
		return "0B"
	case n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	case n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KiB"
	}
	return strconv.FormatInt(n, 10) + "B"
}
