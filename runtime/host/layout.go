package host

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Segment layout. Every rank owns one segment; only the owner ever writes
// it (peers map it read-only), which is what makes the flag protocol simple:
// each word below has exactly one writer.
//
//	[0, headerBytes)            header words (hdr* indices, 8 bytes each)
//	[flagsOff, dataOff)         one 64-byte line per (slot, lane): counter, signature,
//	                            sleeper (wait.go)
//	[dataOff, size)             slots*lanes data areas of laneBytes each:
//	                            Stage chunks, then Scratch chunks if used
const (
	headerBytes = 4096
	lineBytes   = 64 // one cache line per flag pair, so lanes never false-share
	pageBytes   = 4096
	magic       = 0x636f6c6c67656e31 // "collgen1"
)

// Header word indices.
const (
	hdrMagic   = iota
	hdrWorld   // world size, for the peer check
	hdrRank    // owner's rank
	hdrPID     // owner's pid, for liveness checks by peers in the same pid namespace
	hdrPIDNS   // inode of the owner's pid namespace (0: unknown)
	hdrAbort   // nonzero once the owner abandoned a collective (timeout, peer death)
	hdrClosed  // nonzero once the owner called Close
	hdrSlots   // layout, for the peer check
	hdrLanes   //
	hdrLaneLen //
)

// layout is the geometry every rank of a group agrees on at set-up.
type layout struct {
	Slots     int // concurrent collectives without waiting
	Lanes     int // independent pipelines per slot (the caller and the helpers run them)
	LaneBytes int // bytes of Stage+Scratch per lane
}

func (l layout) flagsOff() int { return headerBytes }
func (l layout) dataOff() int {
	return headerBytes + roundUp(l.Slots*l.Lanes*lineBytes, pageBytes)
}
func (l layout) size() int { return l.dataOff() + l.Slots*l.Lanes*l.LaneBytes }

// lineOff is the offset of (slot, lane)'s flag line.
func (l layout) lineOff(slot, lane int) int {
	return l.flagsOff() + (slot*l.Lanes+lane)*lineBytes
}

// areaOff is the offset of (slot, lane)'s data area.
func (l layout) areaOff(slot, lane int) int {
	return l.dataOff() + (slot*l.Lanes+lane)*l.LaneBytes
}

func (l layout) encode() []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint64(b, uint64(l.Slots))
	binary.LittleEndian.PutUint64(b[8:], uint64(l.Lanes))
	binary.LittleEndian.PutUint64(b[16:], uint64(l.LaneBytes))
	return b
}

func decodeLayout(b []byte) (layout, error) {
	if len(b) != 24 {
		return layout{}, fmt.Errorf("bad layout record of %d bytes in the store", len(b))
	}
	return layout{
		Slots:     int(binary.LittleEndian.Uint64(b)),
		Lanes:     int(binary.LittleEndian.Uint64(b[8:])),
		LaneBytes: int(binary.LittleEndian.Uint64(b[16:])),
	}, nil
}

func roundUp(x, m int) int { return (x + m - 1) / m * m }

// word returns a pointer to the 64-bit word at byte offset off of mem. off
// must be a multiple of 8 and mem 8-byte aligned (segments are page or
// word aligned), so sync/atomic may operate on it. Peers' segments are
// mapped read-only: only loads are legal on their words.
func word(mem []byte, off int) *uint64 {
	if off < 0 || off+8 > len(mem) {
		// Compare lengths rather than touch mem[off+7]: a plain read of a
		// byte a peer writes atomically would be a data race.
		panic(fmt.Sprintf("host: word offset %d outside a %d-byte segment", off, len(mem)))
	}
	return (*uint64)(unsafe.Pointer(&mem[off]))
}

// hdr returns a pointer to header word i.
func hdr(mem []byte, i int) *uint64 { return word(mem, i*8) }

// loadHdr reads header word i with an atomic load.
func loadHdr(mem []byte, i int) uint64 { return atomic.LoadUint64(hdr(mem, i)) }
