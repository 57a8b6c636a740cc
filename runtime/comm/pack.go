package comm

import (
	"encoding/binary"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
)

// args is one launch's arguments, before packing.
type args struct {
	input, output          cuda.DevicePtr
	stage, scratch, signal []cuda.DevicePtr // by rank
	seq, status            cuda.DevicePtr
	count, chunk, window   uint64
	timeoutNs, slotBytes   uint64
	rank                   uint64
}

// field is a resolved member of an argument struct: its byte offset and
// the size of one element (4 or 8).
type field struct{ off, size int }

// packer writes one kernel's argument struct. Its fields are resolved
// once per kernel (at New), so a launch writes 11+3W words at known
// offsets instead of searching the layout for each.
type packer struct {
	size                               int
	input, output, seq, status         field
	count, chunk, timeout, slot, rankF field
	window                             field
	kernelID                           field
	stage, scratch, signal             field // arrays of W pointers
	id                                 uint64
	world                              int
	// op is the `op` member and its value (kernels.OpCode of the kernel's
	// op): a program that serves several ops reads it. Packages generated
	// before GenVersion 2 have no such member (and no such programs):
	// then op.size is 0 and nothing is written.
	op     field
	opCode uint64
}

// newPacker resolves kernel k's layout; id is k's index in the library's
// Kernels (what a kernel reports in the status word). A layout missing a
// member or with an array shorter than the world size is an error: the
// generated code and the runtime disagree.
func newPacker(k *kernels.Kernel, id, world int) (*packer, error) {
	if k.Args == nil {
		return nil, errorf(ErrInvalidArgument, "comm: kernel %s has no argument layout; regenerate the library", k.Name)
	}
	p := &packer{size: k.Args.Size, id: uint64(id), world: world}
	if k.Op != "" {
		c := kernels.OpCode(k.Op)
		if c < 0 {
			return nil, errorf(ErrInvalidArgument, "comm: kernel %s has reduce op %q, which this runtime does not know; regenerate the library", k.Name, k.Op)
		}
		p.opCode = uint64(c)
		if f, ok := k.Args.Lookup("op"); ok {
			if f.Size != 4 || f.Offset < 0 || f.Offset+4 > k.Args.Size {
				return nil, errorf(ErrInvalidArgument, "comm: kernel %s: member op of %s (offset %d, %d bytes) is not a 4-byte member inside the %d-byte struct; regenerate the library",
					k.Name, k.Args.CType, f.Offset, f.Size, k.Args.Size)
			}
			p.op = field{off: f.Offset, size: 4}
		} else if k.Symbol != "" && k.Symbol != k.Name {
			return nil, errorf(ErrInvalidArgument, "comm: kernel %s runs in the shared program %s, but argument struct %s has no member \"op\"; regenerate the library", k.Name, k.Symbol, k.Args.CType)
		}
	}
	for _, m := range []struct {
		name  string
		dst   *field
		count int
	}{
		{"input", &p.input, 1}, {"output", &p.output, 1}, {"seq", &p.seq, 1}, {"status", &p.status, 1},
		{"count", &p.count, 1}, {"chunk", &p.chunk, 1}, {"timeout_ns", &p.timeout, 1}, {"slot_bytes", &p.slot, 1},
		{"window", &p.window, 1},
		{"rank", &p.rankF, 1}, {"kernel_id", &p.kernelID, 1},
		{"stage", &p.stage, world}, {"scratch", &p.scratch, world}, {"signal", &p.signal, world},
	} {
		f, ok := k.Args.Lookup(m.name)
		if !ok {
			return nil, errorf(ErrInvalidArgument, "comm: kernel %s: argument struct %s has no member %q; regenerate the library", k.Name, k.Args.CType, m.name)
		}
		if (f.Size != 4 && f.Size != 8) || f.Count < m.count || f.Offset < 0 || f.Offset+f.Size*m.count > k.Args.Size {
			return nil, errorf(ErrInvalidArgument, "comm: kernel %s: member %s of %s (offset %d, %d x %d bytes) does not fit %d values in a %d-byte struct; regenerate the library",
				k.Name, m.name, k.Args.CType, f.Offset, f.Count, f.Size, m.count, k.Args.Size)
		}
		*m.dst = field{off: f.Offset, size: f.Size}
	}
	return p, nil
}

// put writes v as element i of f.
func put(a []byte, f field, i int, v uint64) {
	o := f.off + i*f.size
	if f.size == 4 {
		binary.LittleEndian.PutUint32(a[o:], uint32(v))
	} else {
		binary.LittleEndian.PutUint64(a[o:], v)
	}
}

// pack writes the argument struct for a into the start of buf, which
// holds at least p.size bytes, and returns that part. Bytes no member
// covers (padding) are zero.
func (p *packer) pack(buf []byte, a args) []byte {
	b := buf[:p.size]
	clear(b)
	put(b, p.input, 0, uint64(a.input))
	put(b, p.output, 0, uint64(a.output))
	for r := 0; r < p.world; r++ {
		put(b, p.stage, r, uint64(a.stage[r]))
		put(b, p.scratch, r, uint64(a.scratch[r]))
		put(b, p.signal, r, uint64(a.signal[r]))
	}
	put(b, p.seq, 0, uint64(a.seq))
	put(b, p.status, 0, uint64(a.status))
	put(b, p.count, 0, a.count)
	put(b, p.chunk, 0, a.chunk)
	put(b, p.timeout, 0, a.timeoutNs)
	put(b, p.slot, 0, a.slotBytes)
	put(b, p.window, 0, a.window)
	put(b, p.rankF, 0, a.rank)
	put(b, p.kernelID, 0, p.id)
	if p.op.size != 0 {
		put(b, p.op, 0, p.opCode)
	}
	return b
}
