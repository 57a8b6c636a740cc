package plan

import (
	"fmt"

	"github.com/collgen/collgen/runtime/kernels"
)

// Layout is the by-value argument struct shared by every kernel of one world
// size. Its offsets are computed once here; the CUDA header static_asserts
// them and the generated Go test checks its mirror struct against them.
type Layout struct {
	World int // the world size whose kernels take this struct
	// ArgLayout is the struct's C name, size and field offsets, as the
	// runtime packs it.
	kernels.ArgLayout
}

// Argument struct members, in order. Pointers and 64-bit values are 8
// bytes; rank, kernel_id and op are 4. W is the world size.
//
//	input        const void*          the caller's input
//	output       void*                the caller's output
//	stage[W]     void*                every rank's stage buffer (index = rank)
//	scratch[W]   void*                every rank's scratch buffer
//	signal[W]    unsigned long long*  every rank's signal pad [block][W]
//	seq          unsigned long long*  this rank's per-block barrier sequence
//	status       unsigned long long*  where a timeout is reported (host-mapped)
//	count        unsigned long long   elements in the full buffer
//	chunk        unsigned long long   elements per chunk
//	timeout_ns   unsigned long long   how long one barrier may wait
//	slot_bytes   unsigned long long   distance between the two stage slots; 0 = one slot
//	window       unsigned long long   barrier kernels: elements per chunk per round (0: the whole chunk)
//	rank         int                  this rank
//	kernel_id    int                  the kernel's index in the library, echoed in timeout reports
//	op           int                  the reduce op (kernels.OpCode), read by a program serving several
var argFields = []struct {
	name  string
	size  int
	array bool
}{
	{"input", 8, false},
	{"output", 8, false},
	{"stage", 8, true},
	{"scratch", 8, true},
	{"signal", 8, true},
	{"seq", 8, false},
	{"status", 8, false},
	{"count", 8, false},
	{"chunk", 8, false},
	{"timeout_ns", 8, false},
	{"slot_bytes", 8, false},
	{"window", 8, false},
	{"rank", 4, false},
	{"kernel_id", 4, false},
	{"op", 4, false},
}

// NewLayout computes the argument layout for world size w.
func NewLayout(w int) *Layout {
	l := &Layout{World: w}
	l.CType = fmt.Sprintf("collgen_args_w%d", w)
	off := 0
	for _, f := range argFields {
		n := 1
		if f.array {
			n = w
		}
		off = (off + f.size - 1) / f.size * f.size
		l.Fields = append(l.Fields, kernels.Field{Name: f.name, Offset: off, Size: f.size, Count: n})
		off += f.size * n
	}
	l.Size = (off + 7) / 8 * 8
	return l
}

// GoName is the name of the generated Go mirror struct, e.g. ArgsW4.
func (l *Layout) GoName() string { return fmt.Sprintf("ArgsW%d", l.World) }
