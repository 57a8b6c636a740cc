package bench

import "github.com/collgen/collgen/coll"

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
	// aligned allocation: 0, or one element for an Awkward shape.
	Offset int64
}

// Awkward returns sh's awkward twin: one element less (all-reduce: in all,
// the others: per rank), with the input and output pointers one element
// past an aligned allocation. Those are the sizes and pointers real
// tensors have (a hidden size times a token count, a slice of a larger
// tensor) that fall off the kernels' vector boundaries. ok is false when
// sh has only one element (per rank) to take away.
func Awkward(collective coll.Collective, dtype coll.DType, sh Shape, world int) (aw Shape, ok bool) {
	es := int64(dtype.Size())
	if sh.Count <= 1 || es == 0 {
		return Shape{}, false
	}
	if collective == coll.AllReduce {
		aw, ok = ShapeFor(collective, dtype, sh.Bytes-es, world)
	} else {
		aw, ok = ShapeFor(collective, dtype, sh.Bytes-es*int64(world), world)
	}
	aw.Offset = es
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
