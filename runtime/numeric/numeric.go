// Package numeric holds the element arithmetic of collgen's host backend:
// f16/bf16 <-> f32 conversion, a float64 reference for checking collective
// results, and portable reduce loops used when no generated library is at
// hand (tests, `collgen bench` built without generated code). Element types
// and their sizes are package coll's.
package numeric

import (
	"fmt"
	"math"
	"slices"

	"github.com/collgen/collgen/coll"
)

// DTypes lists the host element types (every reducible one; fp8 is only
// copied) in canonical order.
var DTypes = []coll.DType{coll.F32, coll.F64, coll.F16, coll.BF16, coll.I32, coll.I64}

// CheckDType returns an error naming the host dtypes when dtype is not one.
func CheckDType(dtype coll.DType) error {
	if !slices.Contains(DTypes, dtype) {
		return fmt.Errorf("unknown dtype %q (host dtypes: %v)", dtype, DTypes)
	}
	return nil
}

// CheckOp returns an error naming the known ops when op is unknown.
func CheckOp(op coll.Op) error {
	if !op.Valid() {
		return fmt.Errorf("unknown reduce op %q (ops: %v)", op, coll.Ops())
	}
	return nil
}

// F16ToF32 converts an IEEE 754 binary16 value to float32 exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: value = mant * 2^-24, exact in float32.
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// F32ToF16 converts a float32 to binary16 with round-to-nearest-even;
// overflow gives infinity and NaN stays NaN.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 // quiet NaN
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal or zero in f16.
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rem := m & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, correctly giving inf at the top
	}
	return sign | uint16(r)
}

// BF16ToF32 converts a bfloat16 value to float32 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts a float32 to bfloat16 with round-to-nearest-even; NaN
// stays NaN.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
