package kernels

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/collgen/collgen/coll"
)

// TestInboxFootprint pins the inbox sizes the CUDA header computes
// (cg_ll::units, cg_ll128::units, cg_lamport::units times 16 bytes): the runtime sizes stage
// slots and grids from them, so a mismatch would overrun a slot.
func TestInboxFootprint(t *testing.T) {
	for _, c := range []struct {
		protocol coll.Protocol
		bytes    int64
		want     int64
	}{
		{coll.LL, 0, 0},
		{coll.LL, 1, 16},
		{coll.LL, 8, 16},
		{coll.LL, 9, 32},
		{coll.LL128, 1, 128},
		{coll.LL128, 120, 128},
		{coll.LL128, 121, 256},
		{coll.LL128, 1 << 20, 8739 * 128},
		{coll.Lamport, 0, 0},
		{coll.Lamport, 1, 16},
		{coll.Lamport, 16, 16},
		{coll.Lamport, 17, 32},
		{coll.Lamport, 1 << 20, 1 << 20},
	} {
		if got := InboxChunkBytes(c.protocol, c.bytes); got != c.want {
			t.Errorf("InboxChunkBytes(%q, %d) = %d, want %d", c.protocol, c.bytes, got, c.want)
		}
	}
	k := &Kernel{Protocol: coll.LL128, InboxChunks: 16, Launch: Launch{VectorBytes: 8}}
	// 1000 bf16 elements: 2000 bytes, 17 lines of 8 units, rounded up to
	// whole warps (cg_push_shift starts every chunk on a warp).
	if got := k.ThreadUnits(1000, 2); got != 160 {
		t.Errorf("LL128 ThreadUnits = %d, want 17*8 = 136 rounded up to 160", got)
	}
	if got := k.SlotBytes(8000, 2000); got != 16*17*128 {
		t.Errorf("LL128 SlotBytes = %d, want %d", got, 16*17*128)
	}
	b := &Kernel{Launch: Launch{VectorBytes: 16}}
	if got := b.ThreadUnits(1000, 2); got != 128 || b.Push() || !k.Push() {
		t.Errorf("barrier ThreadUnits = %d (want 125 vectors rounded up to 128), Push %v/%v", got, b.Push(), k.Push())
	}
	if got := b.SlotBytes(8000, 2000); got != 8000 {
		t.Errorf("barrier SlotBytes = %d, want 8000", got)
	}
	// Lamport: one thread per 16 payload bytes, an inbox as large as the
	// payload (LL's is twice it).
	lp := &Kernel{Protocol: coll.Lamport, InboxChunks: 4, Launch: Launch{VectorBytes: 16}}
	if got, ll := lp.SlotBytes(8000, 2000), (&Kernel{Protocol: coll.LL, InboxChunks: 4}).SlotBytes(8000, 2000); got != 4*2000 || ll != 2*got || !lp.Push() {
		t.Errorf("Lamport SlotBytes = %d (LL %d), Push %v; want 8000, half of LL's", got, ll, lp.Push())
	}
	if got := lp.ThreadUnits(1000, 2); got != 128 {
		t.Errorf("Lamport ThreadUnits = %d, want 125 lines rounded up to 128", got)
	}
	if got := PayloadPerLine(coll.Lamport); !strings.Contains(got, "16 payload bytes in 16") {
		t.Errorf("PayloadPerLine(lamport) = %q", got)
	}
}

func TestSourcesFromFS(t *testing.T) {
	l := &Library{Package: "p", Sources: fstest.MapFS{
		"k.cu":  {Data: []byte(`#include "h.cuh"`)},
		"h.cuh": {Data: []byte("// header")},
	}}
	if src, err := l.Source("k.cu"); err != nil || src != `#include "h.cuh"` {
		t.Errorf("Source(k.cu) = %q, %v", src, err)
	}
	if _, err := l.Source("missing.cu"); err == nil {
		t.Error("a missing source was found")
	}
	if h, err := l.Headers(); err != nil || len(h) != 1 || h["h.cuh"] != "// header" {
		t.Errorf("Headers() = %v, %v", h, err)
	}
	if _, err := (&Library{}).Source("k.cu"); err == nil {
		t.Error("a library without sources returned one")
	}
}
