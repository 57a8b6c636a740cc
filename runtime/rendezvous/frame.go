package rendezvous

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxFrameSize is the largest frame (header excluded) a TCP server or
// client accepts unless its options say otherwise.
const DefaultMaxFrameSize = 16 << 20

// Frame layout on the wire, all integers big-endian:
//
//	length  uint32  bytes that follow (the payload); at most the max frame size
//	op      uint8   request op, or response status
//	flags   uint8   op-specific bits
//	id      uint64  client id (dedupes replayed requests)
//	seq     uint64  request sequence number within the client
//	num     int64   op-specific integer (delta, timeout in ms, counter value)
//	nargs   uint32  number of byte-string arguments
//	args    nargs × (uint32 length, bytes)
//
// A payload must be consumed exactly: trailing bytes are an error.
const (
	frameLenSize  = 4
	payloadHeader = 1 + 1 + 8 + 8 + 8 + 4
)

// frame is one request or response.
type frame struct {
	Op    uint8
	Flags uint8
	ID    uint64
	Seq   uint64
	Num   int64
	Args  [][]byte
}

// errTooLarge marks a frame refused for its size before sending.
var errTooLarge = errors.New("frame too large")

// errOverLimit marks a frame read whose announced length is over the
// reader's limit: retrying cannot help.
var errOverLimit = errors.New("frame over the reader's limit")

// errFrame marks a malformed frame; the server disconnects its sender.
var errFrame = errors.New("rendezvous: malformed frame")

// appendFrame appends f's encoding, length prefix included, to b.
func appendFrame(b []byte, f *frame) []byte {
	size := payloadHeader
	for _, a := range f.Args {
		size += 4 + len(a)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(size))
	b = append(b, f.Op, f.Flags)
	b = binary.BigEndian.AppendUint64(b, f.ID)
	b = binary.BigEndian.AppendUint64(b, f.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(f.Num))
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Args)))
	for _, a := range f.Args {
		b = binary.BigEndian.AppendUint32(b, uint32(len(a)))
		b = append(b, a...)
	}
	return b
}

// encodedSize is the payload size of f (length prefix excluded).
func encodedSize(f *frame) int {
	size := payloadHeader
	for _, a := range f.Args {
		size += 4 + len(a)
	}
	return size
}

// decodeFrame decodes one payload (without its length prefix). It never
// allocates more than len(p) bytes in total, whatever the counts inside claim.
func decodeFrame(p []byte) (*frame, error) {
	if len(p) < payloadHeader {
		return nil, fmt.Errorf("%w: %d-byte payload is shorter than the %d-byte header", errFrame, len(p), payloadHeader)
	}
	f := &frame{
		Op:    p[0],
		Flags: p[1],
		ID:    binary.BigEndian.Uint64(p[2:]),
		Seq:   binary.BigEndian.Uint64(p[10:]),
		Num:   int64(binary.BigEndian.Uint64(p[18:])),
	}
	n := binary.BigEndian.Uint32(p[26:])
	rest := p[payloadHeader:]
	// Each argument needs at least its 4-byte length, so a count larger than
	// that bound is a lie; checking first keeps the allocation bounded.
	if uint64(n) > uint64(len(rest)/4) {
		return nil, fmt.Errorf("%w: %d arguments cannot fit in %d bytes", errFrame, n, len(rest))
	}
	if n > 0 {
		f.Args = make([][]byte, n)
	}
	for i := range f.Args {
		if len(rest) < 4 {
			return nil, fmt.Errorf("%w: argument %d length is truncated", errFrame, i)
		}
		l := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(l) > uint64(len(rest)) {
			return nil, fmt.Errorf("%w: argument %d claims %d bytes, %d left", errFrame, i, l, len(rest))
		}
		f.Args[i] = rest[:l:l]
		rest = rest[l:]
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errFrame, len(rest))
	}
	return f, nil
}

// readFrame reads one length-prefixed frame, refusing payloads over max
// bytes before allocating them.
func readFrame(r io.Reader, max int) (*frame, error) {
	n, err := readFrameLen(r, max)
	if err != nil {
		return nil, err
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return decodeFrame(p)
}

// readFrameLen reads a frame's length prefix, refusing one over max bytes.
func readFrameLen(r io.Reader, max int) (uint32, error) {
	var hdr [frameLenSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max) {
		return 0, fmt.Errorf("%w: %d-byte frame exceeds the %d-byte limit", errors.Join(errFrame, errOverLimit), n, max)
	}
	return n, nil
}

// writeFrame writes f with its length prefix in one Write call.
func writeFrame(w io.Writer, f *frame, max int) error {
	if size := encodedSize(f); size > max {
		return fmt.Errorf("rendezvous: %w: %d bytes exceeds the %d-byte limit; store smaller values", errTooLarge, size, max)
	}
	_, err := w.Write(appendFrame(nil, f))
	return err
}
