package comm

import (
	"unsafe"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/numeric"
)

// memKind says where a Buffer's memory lives.
type memKind uint8

const (
	noMemory     memKind = iota // the zero Buffer
	deviceMemory                // DeviceBuffer: an address on this rank's GPU
	hostMemory                  // HostBuffer, HostSlice: process memory
)

func (k memKind) String() string {
	switch k {
	case deviceMemory:
		return "DeviceBuffer"
	case hostMemory:
		return "HostBuffer"
	}
	return "zero Buffer"
}

// Buffer is a collective's input or output: device memory (DeviceBuffer)
// for a GPU communicator, host memory (HostBuffer, HostSlice) for a host
// communicator. The kind is checked on every call: a buffer of the wrong
// kind is an ErrInvalidArgument error, never address 0 or an empty slice.
// A Buffer made by HostSlice also carries its element type, which must
// match the call's dtype.
type Buffer struct {
	kind  memKind
	dev   cuda.DevicePtr
	host  []byte
	dtype coll.DType // set by HostSlice; "" for untyped memory
}

// DeviceBuffer wraps a device address on the communicator's GPU. Its size
// is the caller's to guarantee: the communicator cannot check it.
func DeviceBuffer(p cuda.DevicePtr) Buffer { return Buffer{kind: deviceMemory, dev: p} }

// HostBuffer wraps host memory holding elements of the call's dtype; its
// length is checked against the call's count.
func HostBuffer(b []byte) Buffer { return Buffer{kind: hostMemory, host: b} }

// Element is a Go type whose slices HostSlice accepts; each maps to one
// coll.DType (DTypeOf).
type Element interface {
	float32 | float64 | int32 | int64 | BFloat16 | Float16 | Float8E4M3 | Float8E5M2
}

// BFloat16 holds the bits of one bfloat16 value (coll.BF16).
type BFloat16 uint16

// Float16 holds the bits of one IEEE half-precision value (coll.F16).
type Float16 uint16

// ToBFloat16 rounds f to the nearest bfloat16 (ties to even; NaN stays NaN).
func ToBFloat16(f float32) BFloat16 { return BFloat16(numeric.F32ToBF16(f)) }

// Float32 returns the value of b, exactly.
func (b BFloat16) Float32() float32 { return numeric.BF16ToF32(uint16(b)) }

// ToFloat16 rounds f to the nearest IEEE half (ties to even; out of range
// gives +/-Inf, NaN stays NaN).
func ToFloat16(f float32) Float16 { return Float16(numeric.F32ToF16(f)) }

// Float32 returns the value of h, exactly.
func (h Float16) Float32() float32 { return numeric.F16ToF32(uint16(h)) }

// Float8E4M3 holds the bits of one fp8 e4m3 value (coll.E4M3).
type Float8E4M3 uint8

// Float8E5M2 holds the bits of one fp8 e5m2 value (coll.E5M2).
type Float8E5M2 uint8

// DTypeOf returns the element type of T.
func DTypeOf[T Element]() coll.DType {
	switch any(*new(T)).(type) {
	case float32:
		return coll.F32
	case float64:
		return coll.F64
	case int32:
		return coll.I32
	case int64:
		return coll.I64
	case BFloat16:
		return coll.BF16
	case Float16:
		return coll.F16
	case Float8E4M3:
		return coll.E4M3
	}
	return coll.E5M2
}

// HostSlice wraps a slice of host memory as a Buffer of its element type:
// a call whose dtype differs is refused, and the length is checked in
// elements. The communicator reads and writes the slice's memory in place;
// keep it alive and untouched until the call returns.
func HostSlice[T Element](s []T) Buffer {
	var b []byte
	if len(s) > 0 {
		b = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(s[0])))
	}
	return Buffer{kind: hostMemory, host: b, dtype: DTypeOf[T]()}
}

// AllReduceSlice all-reduces len(in) elements of host slices with op on a
// host communicator; count and dtype come from the slices, so they cannot
// disagree with the memory. len(out) must equal len(in).
func AllReduceSlice[T Element](c *Communicator, in, out []T, op coll.Op, o Options) error {
	if len(out) != len(in) {
		return errorf(ErrInvalidArgument, "comm: AllReduceSlice: out has %d elements, in %d; they must be equal", len(out), len(in))
	}
	return c.AllReduce(HostSlice(in), HostSlice(out), len(in), DTypeOf[T](), op, o)
}

// ReduceScatterSlice reduces WorldSize*len(out) elements of in with op and
// leaves this rank's block in out. len(in) must be WorldSize*len(out).
func ReduceScatterSlice[T Element](c *Communicator, in, out []T, op coll.Op, o Options) error {
	if len(in) != c.WorldSize()*len(out) {
		return errorf(ErrInvalidArgument, "comm: ReduceScatterSlice: in has %d elements, want world size %d times len(out) %d", len(in), c.WorldSize(), len(out))
	}
	return c.ReduceScatter(HostSlice(in), HostSlice(out), len(out), DTypeOf[T](), op, o)
}

// AllGatherSlice gathers every rank's in, in rank order, into out. len(out)
// must be WorldSize*len(in).
func AllGatherSlice[T Element](c *Communicator, in, out []T, o Options) error {
	if len(out) != c.WorldSize()*len(in) {
		return errorf(ErrInvalidArgument, "comm: AllGatherSlice: out has %d elements, want world size %d times len(in) %d", len(out), c.WorldSize(), len(in))
	}
	return c.AllGather(HostSlice(in), HostSlice(out), len(in), DTypeOf[T](), o)
}
