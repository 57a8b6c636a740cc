// Package coll is collgen's vocabulary: the typed names of collectives,
// algorithms, element types, reduce ops, kernel protocols and topology kinds
// that the spec, the schedule IR, the planner, the generated code and the
// runtime all share.
//
// It sits at the bottom of the import graph and imports nothing of collgen.
// Each name is a string type, so it prints, marshals and appears in spec files
// as itself, and each has constants, a Valid method and a Parse function:
// strings are parsed only at the edges (flags, spec files), and a typo in Go
// code does not compile.
package coll

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrUnknown is wrapped by every Parse error: the name is not one collgen knows.
var ErrUnknown = errors.New("unknown name")

// unknown builds the error every Parse function returns.
func unknown(kind, got string, known []string) error {
	return fmt.Errorf("%w: %s %q (known: %s)", ErrUnknown, kind, got, strings.Join(known, ", "))
}

// names converts a list of typed names to strings.
func names[T ~string](xs []T) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = string(x)
	}
	return out
}

// parse returns s as a T when it is one of all, else an ErrUnknown error.
func parse[T ~string](kind, s string, all []T) (T, error) {
	if slices.Contains(all, T(s)) {
		return T(s), nil
	}
	return "", unknown(kind, s, names(all))
}

// Collective is a collective operation.
type Collective string

// Collectives, in canonical order.
const (
	AllReduce     Collective = "allreduce"
	ReduceScatter Collective = "reduce_scatter"
	AllGather     Collective = "allgather"
)

// Collectives returns every collective, in canonical order.
func Collectives() []Collective { return []Collective{AllReduce, ReduceScatter, AllGather} }

// ParseCollective returns the collective named s.
func ParseCollective(s string) (Collective, error) {
	return parse("collective", s, Collectives())
}

// String returns the collective's name.
func (c Collective) String() string { return string(c) }

// Valid reports whether c is a known collective.
func (c Collective) Valid() bool { return slices.Contains(Collectives(), c) }

// Reduces reports whether c combines values (and so takes a reduce op and a
// reducible element type) rather than only copying them.
func (c Collective) Reduces() bool { return c == AllReduce || c == ReduceScatter }

// Order is c's index in Collectives, or len(Collectives()) if unknown.
func (c Collective) Order() int {
	if i := slices.Index(Collectives(), c); i >= 0 {
		return i
	}
	return len(Collectives())
}

// DType is an element type.
type DType string

// Element types.
const (
	F32  DType = "f32"
	F16  DType = "f16"
	BF16 DType = "bf16"
	F64  DType = "f64"
	I32  DType = "i32"
	I64  DType = "i64"
	E4M3 DType = "e4m3" // fp8, 4 exponent bits, 3 mantissa bits; copy only
	E5M2 DType = "e5m2" // fp8, 5 exponent bits, 2 mantissa bits; copy only
)

// DTypes returns every element type, in documentation order.
func DTypes() []DType { return []DType{F32, F16, BF16, F64, I32, I64, E4M3, E5M2} }

// ParseDType returns the element type named s.
func ParseDType(s string) (DType, error) { return parse("dtype", s, DTypes()) }

// String returns the element type's name.
func (d DType) String() string { return string(d) }

// Size returns the size of one element in bytes, or 0 for an unknown type.
// It is the one table of element sizes in collgen.
func (d DType) Size() int {
	switch d {
	case F64, I64:
		return 8
	case F32, I32:
		return 4
	case F16, BF16:
		return 2
	case E4M3, E5M2:
		return 1
	}
	return 0
}

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d.Size() != 0 }

// IsFloat8 reports whether d is an fp8 type, which is only copied (all-gather),
// never reduced.
func (d DType) IsFloat8() bool { return d == E4M3 || d == E5M2 }

// WideAccumulator reports whether d's reductions accumulate in a wider
// type than d: f16 and bf16 add in f32 (the kernels' T::A), the other
// types in their own.
func (d DType) WideAccumulator() bool { return d == F16 || d == BF16 }

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d != I32 && d != I64 && d.Valid() }

// NCCL returns d's ncclDataType_t value (nccl.h: ncclInt32 = 2, ...,
// ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11); ok is false
// for an unknown type.
func (d DType) NCCL() (value int, ok bool) {
	v, ok := map[DType]int{I32: 2, I64: 4, F16: 6, F32: 7, F64: 8, BF16: 9, E4M3: 10, E5M2: 11}[d]
	return v, ok
}

// Op is a reduce op.
type Op string

// Reduce ops.
const (
	Sum Op = "sum"
	Max Op = "max"
	Min Op = "min"
)

// Ops returns every reduce op.
func Ops() []Op { return []Op{Sum, Max, Min} }

// ParseOp returns the reduce op named s.
func ParseOp(s string) (Op, error) { return parse("op", s, Ops()) }

// String returns the op's name.
func (o Op) String() string { return string(o) }

// Valid reports whether o is a known reduce op.
func (o Op) Valid() bool { return slices.Contains(Ops(), o) }

// NCCL returns o's ncclRedOp_t value (ncclSum = 0, ncclMax = 2, ncclMin = 3).
func (o Op) NCCL() (value int, ok bool) {
	v, ok := map[Op]int{Sum: 0, Max: 2, Min: 3}[o]
	return v, ok
}

// Algorithm names how a collective runs: a generated schedule, NCCL, or Auto
// (the selection rules choose by size).
type Algorithm string

// Algorithms. The generated ones are schedules (package schedule has one
// builder for each); NCCL hands the collective to NCCL.
const (
	Auto         Algorithm = ""
	OneShot      Algorithm = "oneshot"
	TwoShot      Algorithm = "twoshot"
	HCM          Algorithm = "hcm" // hybrid cube mesh all-reduce, 8 GPUs
	OneShotLL    Algorithm = "oneshot_ll"
	TwoShotLL    Algorithm = "twoshot_ll"
	OneShotLL128 Algorithm = "oneshot_ll128"
	TwoShotLL128 Algorithm = "twoshot_ll128"
	// OneShotLamport and TwoShotLamport: the LL schedules over the Lamport
	// protocol (16 payload bytes a line, no flag); float dtypes only.
	OneShotLamport Algorithm = "oneshot_lamport"
	TwoShotLamport Algorithm = "twoshot_lamport"
	NCCL           Algorithm = "nccl"
	// Hierarchical runs a group that spans hosts: the generated kernels
	// within each host and NCCL across hosts (runtime/comm, hier.go). It is
	// never generated; a multi-host group's selection rules name it.
	Hierarchical Algorithm = "hierarchical"
	// Copy is what a GPU communicator of one rank runs for every call,
	// whatever algorithm it names: the one rank's result is its input, so
	// it copies the input to the output (nothing when they are the same
	// memory). Plans report it; it is never generated, and neither rules
	// nor calls can name it (it is not Valid).
	Copy          Algorithm = "copy"
	autoSpelledAs           = "auto"
)

// Algorithms returns every generated algorithm (not Auto, not NCCL).
func Algorithms() []Algorithm {
	return []Algorithm{OneShot, TwoShot, HCM, OneShotLL, TwoShotLL, OneShotLL128, TwoShotLL128, OneShotLamport, TwoShotLamport}
}

// ParseAlgorithm returns the algorithm named s: a generated one, "nccl",
// "hierarchical", or "" / "auto" for Auto.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == autoSpelledAs {
		return Auto, nil
	}
	all := append([]Algorithm{Auto, NCCL, Hierarchical}, Algorithms()...)
	if slices.Contains(all, Algorithm(s)) {
		return Algorithm(s), nil
	}
	known := names(all)
	known[0] = autoSpelledAs
	return "", unknown("algorithm", s, known)
}

// String returns the algorithm's name; Auto prints as "auto".
func (a Algorithm) String() string {
	if a == Auto {
		return autoSpelledAs
	}
	return string(a)
}

// Valid reports whether a is Auto, NCCL, Hierarchical or a generated
// algorithm.
func (a Algorithm) Valid() bool { return a == Auto || a == NCCL || a == Hierarchical || a.Generated() }

// Generated reports whether a names a generated schedule.
func (a Algorithm) Generated() bool { return slices.Contains(Algorithms(), a) }

// Protocol is the protocol a generated algorithm's kernels synchronise
// with (its schedule's, which package schedule holds to it): Barrier for
// the pull algorithms and for names that are not generated.
func (a Algorithm) Protocol() Protocol {
	switch a {
	case OneShotLL, TwoShotLL:
		return LL
	case OneShotLL128, TwoShotLL128:
		return LL128
	case OneShotLamport, TwoShotLamport:
		return Lamport
	}
	return Barrier
}

// Protocol names how a kernel's ranks synchronise (see package schedule).
type Protocol string

// Protocols.
const (
	// Barrier: pull steps separated by barriers.
	Barrier Protocol = ""
	// LL: push steps into peers' inboxes, 16-byte lines of 8 payload bytes
	// and two flag copies.
	LL Protocol = "ll"
	// LL128: LL's schedules over 128-byte lines of 120 payload bytes and a flag.
	LL128 Protocol = "ll128"
	// Lamport: LL's schedules over 16-byte lines that are all payload. The
	// data carries its own readiness: every element is sent with its bits
	// inverted (the all-ones NaN as another NaN), so no element on the
	// wire is all zero bits, an inbox line is ready when none of its
	// elements is zero, and the reader zeroes the line after it. Floats of
	// 2 or 4 bytes only (Supports).
	Lamport Protocol = "lamport"
)

// Protocols returns every protocol.
func Protocols() []Protocol { return []Protocol{Barrier, LL, LL128, Lamport} }

// String returns the protocol's name; Barrier prints as "barrier".
func (p Protocol) String() string {
	if p == Barrier {
		return "barrier"
	}
	return string(p)
}

// Valid reports whether p is a known protocol.
func (p Protocol) Valid() bool { return slices.Contains(Protocols(), p) }

// Push reports whether p pushes data into peers' inboxes, each line
// carrying its own readiness (LL, LL128, Lamport).
func (p Protocol) Push() bool { return p == LL || p == LL128 || p == Lamport }

// Supports reports whether p can carry elements of dt: Lamport gives up
// one bit pattern per element (all ones, a NaN, sent as another NaN),
// which only floats whose reductions return the canonical NaN anyway can
// spare (f16, bf16, f32; docs/numerics.md); the other protocols carry
// every dtype.
func (p Protocol) Supports(dt DType) bool {
	if p != Lamport {
		return true
	}
	return dt.IsFloat() && !dt.IsFloat8() && (dt.Size() == 2 || dt.Size() == 4)
}

// TopologyKind is the kind of interconnect a group of ranks has.
type TopologyKind string

// Topology kinds.
const (
	// NVLinkFull: every pair of GPUs joined by NVLink (NVSwitch or full mesh).
	NVLinkFull TopologyKind = "nvlink_full"
	// HybridCubeMesh: the 8-GPU hybrid cube mesh of PyTorch's IntraNodeComm.
	HybridCubeMesh TopologyKind = "hybrid_cube_mesh"
	// PCIeP2P: GPUs reaching each other over PCIe peer-to-peer.
	PCIeP2P TopologyKind = "pcie_p2p"
	// HostSHM: CPU ranks over host shared memory.
	HostSHM TopologyKind = "host_shm"
)

// TopologyKinds returns every topology kind, in documentation order.
func TopologyKinds() []TopologyKind {
	return []TopologyKind{NVLinkFull, HybridCubeMesh, PCIeP2P, HostSHM}
}

// ParseTopologyKind returns the topology kind named s.
func ParseTopologyKind(s string) (TopologyKind, error) {
	return parse("topology kind", s, TopologyKinds())
}

// String returns the kind's name.
func (k TopologyKind) String() string { return string(k) }

// Valid reports whether k is a known kind.
func (k TopologyKind) Valid() bool { return slices.Contains(TopologyKinds(), k) }

// IsGPU reports whether ranks of kind k are GPUs (and so can fall back to
// NCCL).
func (k TopologyKind) IsGPU() bool { return k.Valid() && k != HostSHM }

// Bytes returns count elements of d in bytes, times every factor (a world
// size, say), with ok false when count or a factor is negative, d is
// unknown, or the product does not fit in an int64. Size checks use it
// before any multiplication, so a huge count is an error, never a wrapped
// size.
func (d DType) Bytes(count int64, factors ...int64) (n int64, ok bool) {
	n = int64(d.Size())
	if n == 0 {
		return 0, false
	}
	// No append of count to factors: this runs on every collective call
	// and must not allocate.
	if n, ok = mulChecked(n, count); !ok {
		return 0, false
	}
	for _, f := range factors {
		if n, ok = mulChecked(n, f); !ok {
			return 0, false
		}
	}
	return n, true
}

// mulChecked returns n*f for n > 0, or false when f is negative or the
// product does not fit in an int64.
func mulChecked(n, f int64) (int64, bool) {
	if f < 0 || (f != 0 && n > (1<<63-1)/f) {
		return 0, false
	}
	return n * f, true
}
