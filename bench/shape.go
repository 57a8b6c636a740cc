package bench

import (
	"fmt"

	"github.com/collgen/collgen/coll"
)

// Shape is what one message size means for a collective.
type Shape struct {
	// Bytes is the full buffer (for reduce-scatter the input, for
	// all-gather the output), rounded down to a whole number of elements
	// per rank; the size the tables report.
	Bytes int64
	// Count is the count argument of the call: elements for all-reduce,
	// recvCount for reduce-scatter, sendCount for all-gather.
	Count int
	// InBytes and OutBytes are each rank's input and output sizes.
	InBytes, OutBytes int64
	// Offset is how many bytes the input and output pointers lie past an
	// aligned allocation: 0, or one element for an Awkward shape that
	// moves them.
	Offset int64
	// Awkward marks an awkward twin (Awkward), which may have the count of
	// the regular size it follows (AwkwardOffset).
	Awkward bool
}

// AwkwardKind is which departures from a regular size an awkward twin
// makes: the count one element less, the pointers one element off, or
// both (the default of `collgen bench --awkward`).
type AwkwardKind int

const (
	// AwkwardNone makes no twins.
	AwkwardNone AwkwardKind = iota
	// AwkwardBoth: one element less (per rank) and the pointers one
	// element off alignment.
	AwkwardBoth
	// AwkwardCount: one element less (per rank), aligned pointers.
	AwkwardCount
	// AwkwardOffset: the same count, the pointers one element off.
	AwkwardOffset
)

var awkwardNames = map[string]AwkwardKind{"both": AwkwardBoth, "count": AwkwardCount, "offset": AwkwardOffset}

// ParseAwkward reads a kind by name: both, count or offset.
func ParseAwkward(s string) (AwkwardKind, error) {
	if k, ok := awkwardNames[s]; ok {
		return k, nil
	}
	return AwkwardNone, fmt.Errorf("awkward sizes %q: want both, count or offset", s)
}

// String is the kind's name (ParseAwkward's), "" for AwkwardNone.
func (k AwkwardKind) String() string {
	for name, v := range awkwardNames {
		if v == k {
			return name
		}
	}
	return ""
}

// Describe says what the kind's twins are, for a table's footnote.
func (k AwkwardKind) Describe() string {
	switch k {
	case AwkwardCount:
		return "one element less (per rank), aligned pointers"
	case AwkwardOffset:
		return "the same size, input and output pointers one element off alignment"
	}
	return "one element less (per rank), input and output pointers one element off alignment"
}

// Awkward returns sh's awkward twin of the given kind (AwkwardBoth: one
// element less, in all for all-reduce and per rank for the others, with
// the input and output pointers one element past an aligned allocation).
// Those are the sizes and pointers real tensors have (a hidden size times
// a token count, a slice of a larger tensor) that fall off the kernels'
// vector boundaries; the kinds that make one departure alone tell which of
// the two a cost comes from. ok is false for AwkwardNone, and for a kind
// that takes an element away when sh has only one (per rank).
func Awkward(collective coll.Collective, dtype coll.DType, sh Shape, world int, kind AwkwardKind) (aw Shape, ok bool) {
	es := int64(dtype.Size())
	if kind == AwkwardNone || es == 0 {
		return Shape{}, false
	}
	switch {
	case kind == AwkwardOffset:
		aw, ok = sh, true
	case sh.Count <= 1:
		return Shape{}, false
	case collective == coll.AllReduce:
		aw, ok = ShapeFor(collective, dtype, sh.Bytes-es, world)
	default:
		aw, ok = ShapeFor(collective, dtype, sh.Bytes-es*int64(world), world)
	}
	aw.Offset, aw.Awkward = 0, true
	if kind != AwkwardCount {
		aw.Offset = es
	}
	return aw, ok
}

// ShapeFor maps a requested size to a collective's call shape. ok is false
// when the size holds less than one element per rank.
func ShapeFor(collective coll.Collective, dtype coll.DType, bytes int64, world int) (sh Shape, ok bool) {
	es := int64(dtype.Size())
	if es == 0 || world < 1 {
		return Shape{}, false
	}
	switch collective {
	case coll.AllReduce:
		n := bytes / es
		if n < 1 {
			return Shape{}, false
		}
		b := n * es
		return Shape{Bytes: b, Count: int(n), InBytes: b, OutBytes: b}, true
	default:
		per := bytes / es / int64(world)
		if per < 1 {
			return Shape{}, false
		}
		full, part := per*es*int64(world), per*es
		sh := Shape{Bytes: full, Count: int(per)}
		if collective == coll.ReduceScatter {
			sh.InBytes, sh.OutBytes = full, part
		} else {
			sh.InBytes, sh.OutBytes = part, full
		}
		return sh, true
	}
}
