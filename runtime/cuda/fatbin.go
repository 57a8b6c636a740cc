package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// FatbinCode is one entry of a fatbin: machine code (a cubin) for one
// architecture, or PTX the driver can compile for that one and newer.
type FatbinCode struct {
	Arch int  // 90 for sm_90 / compute_90
	PTX  bool // PTX rather than a cubin
}

// String is "sm_90" for a cubin, "compute_90" for PTX.
func (c FatbinCode) String() string {
	if c.PTX {
		return fmt.Sprintf("compute_%d", c.Arch)
	}
	return fmt.Sprintf("sm_%d", c.Arch)
}

// Runs reports whether the driver can run this code on a device of
// compute capability arch (e.g. 90): a cubin built for the same major
// version and an equal or lower minor, or PTX for an equal or lower one.
func (c FatbinCode) Runs(arch int) bool {
	if c.PTX {
		return c.Arch <= arch
	}
	return c.Arch/10 == arch/10 && c.Arch <= arch
}

// errNotFatbin marks an image that is not a fatbin (a cubin or PTX).
var errNotFatbin = errors.New("not a fatbin")

// Fatbin layout (little endian), as nvcc -fatbin writes it: one or more
// blocks, each a 16-byte header (magic 0xBA55ED50, version, header size,
// bytes of entries) and its entries, each an entry header (kind: 1 PTX,
// 2 ELF; header size at byte 4, payload size at byte 8, architecture at
// byte 28) and its payload.
const fatbinMagic = 0xBA55ED50

// FatbinCodes lists what a fatbin image holds, in file order.
func FatbinCodes(image []byte) ([]FatbinCode, error) {
	le := binary.LittleEndian
	var out []FatbinCode
	for off := 0; off < len(image); {
		if len(image)-off < 16 || le.Uint32(image[off:]) != fatbinMagic {
			if off == 0 {
				return nil, errNotFatbin
			}
			break // padding after the last block
		}
		// Sizes are checked against what is left, never added first: a
		// corrupt size near 2^64 would wrap and send the walk backwards.
		hs, size := int(le.Uint16(image[off+6:])), le.Uint64(image[off+8:])
		if hs < 16 || hs > len(image)-off || size > uint64(len(image)-off-hs) {
			return nil, fmt.Errorf("cuda: fatbin block at byte %d runs past the end (%d bytes)", off, len(image))
		}
		end := off + hs + int(size)
		for e := off + hs; e < end; {
			if end-e < 32 {
				return nil, fmt.Errorf("cuda: fatbin entry at byte %d is truncated", e)
			}
			kind, ehs, psize := le.Uint16(image[e:]), int(le.Uint32(image[e+4:])), le.Uint64(image[e+8:])
			if ehs < 32 || ehs > end-e || psize > uint64(end-e-ehs) {
				return nil, fmt.Errorf("cuda: fatbin entry at byte %d runs past its block", e)
			}
			if kind == 1 || kind == 2 {
				out = append(out, FatbinCode{Arch: int(le.Uint32(image[e+28:])), PTX: kind == 1})
			}
			e += ehs + int(psize)
		}
		off = end
	}
	return out, nil
}

// FatbinError is a fatbin the device cannot use: it has no code that runs
// on the device's architecture, or it could not be read or parsed.
type FatbinError struct {
	Fatbin string       // the file, or "embedded"
	Device int          // device ordinal
	Arch   int          // the device's compute capability, e.g. 90
	Codes  []FatbinCode // what the fatbin holds (nil if unreadable)
	Err    error        // the driver's or the reader's error
}

// Error names the fatbin, what it holds, the device's architecture and
// how to build one that fits.
func (e *FatbinError) Error() string {
	if e.Codes == nil {
		return fmt.Sprintf("cuda: fatbin %s on device %d (sm_%d): %v", e.Fatbin, e.Device, e.Arch, e.Err)
	}
	have := make([]string, len(e.Codes))
	for i, c := range e.Codes {
		have[i] = c.String()
	}
	return fmt.Sprintf("cuda: fatbin %s has no code for device %d (sm_%d): it holds %s; rebuild it with `collgen fatbin --arch sm_%d`, or compile with NVRTC (no fatbin): %v",
		e.Fatbin, e.Device, e.Arch, strings.Join(have, ", "), e.Arch, e.Err)
}

// Unwrap returns the cause (a driver *Error such as
// CUDA_ERROR_NO_BINARY_FOR_GPU, or a file error).
func (e *FatbinError) Unwrap() error { return e.Err }

// fatbinMismatch builds the *FatbinError for an image the driver refused
// on a device of arch, or nil when the image's codes do include code the
// device runs (the refusal was for another reason) or it is no fatbin.
func fatbinMismatch(name string, image []byte, device, arch int, err error) *FatbinError {
	codes, perr := FatbinCodes(image)
	if perr != nil {
		return nil
	}
	for _, c := range codes {
		if c.Runs(arch) {
			return nil
		}
	}
	if codes == nil {
		codes = []FatbinCode{}
	}
	return &FatbinError{Fatbin: name, Device: device, Arch: arch, Codes: codes, Err: err}
}
