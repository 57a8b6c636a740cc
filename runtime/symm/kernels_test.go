//go:build linux && (amd64 || arm64)

package symm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSignalArgsLayout checks the signal kernel's argument against the
// C struct in kernels/signal.cu: the size its static_assert names, the
// peer limit its #define names, and where every field lands.
func TestSignalArgsLayout(t *testing.T) {
	if !strings.Contains(signalSource, fmt.Sprintf("sizeof(cg_symm_signal_args) == %d", sigArgsBytes)) {
		t.Errorf("signal.cu does not assert sizeof(cg_symm_signal_args) == %d", sigArgsBytes)
	}
	if !strings.Contains(signalSource, fmt.Sprintf("#define CG_SYMM_MAX_PEERS %d\n", MaxStreamPeers)) {
		t.Errorf("signal.cu's CG_SYMM_MAX_PEERS is not %d", MaxStreamPeers)
	}
	if sigTimeoutOff%8 != 0 || sigTimeoutOff < sigChannelOff+4 || sigTimeoutOff > sigChannelOff+8 {
		t.Errorf("timeout_ns at %d after channel at %d: not the next 8-byte boundary", sigTimeoutOff, sigChannelOff)
	}
	if !strings.Contains(DeviceHeader, fmt.Sprintf("(%d bytes", KernelGroupBytes)) {
		t.Errorf("collgen_symm.cuh does not document cg_symm_group as %d bytes", KernelGroupBytes)
	}
	op := &SignalOp{Kind: SignalBarrier, Rank: 2, Channel: 7, Peers: []int{0, 1, 3},
		Put: []uintptr{0x1000, 0x2000, 0x3000}, Wait: []uintptr{0x4000, 0x5000, 0x6000}, Timeout: 3 * time.Second}
	buf := bytes.Repeat([]byte{0xff}, sigArgsBytes) // a reused buffer's stale bytes
	a, err := signalArgs(buf, op, 0xabc0, 0xdef0)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	u64 := func(off int) uint64 { return le.Uint64(a[off:]) }
	u32 := func(off int) uint32 { return le.Uint32(a[off:]) }
	for i := range 3 {
		if u64(sigPutOff+8*i) != uint64(op.Put[i]) || u64(sigWaitOff+8*i) != uint64(op.Wait[i]) || u32(sigPeersOff+4*i) != uint32(op.Peers[i]) {
			t.Errorf("peer %d: put %#x wait %#x id %d", i, u64(sigPutOff+8*i), u64(sigWaitOff+8*i), u32(sigPeersOff+4*i))
		}
	}
	if len(a) != sigArgsBytes || u32(sigNPeersOff) != 3 || u32(sigOpOff) != 3 || u32(sigRankOff) != 2 || u32(sigChannelOff) != 7 ||
		u64(sigTimeoutOff) != uint64(3*time.Second) || u64(sigStatusOff) != 0xabc0 || u64(sigBrokenOff) != 0xdef0 {
		t.Errorf("header fields wrong: %d bytes, %d peers, op %d, rank %d, channel %d, timeout %d, status %#x, broken %#x",
			len(a), u32(sigNPeersOff), u32(sigOpOff), u32(sigRankOff), u32(sigChannelOff), u64(sigTimeoutOff), u64(sigStatusOff), u64(sigBrokenOff))
	}
	for off := sigPutOff + 8*3; off < sigWaitOff; off++ {
		if a[off] != 0 {
			t.Fatalf("byte %d (past the last peer's put address) is %#x: the reused buffer was not cleared", off, a[off])
		}
	}
	big := &SignalOp{Kind: SignalBarrier, Peers: make([]int, MaxStreamPeers+1)}
	if _, err := signalArgs(buf, big, 0, 0); err == nil || !strings.Contains(err.Error(), "at most 63") {
		t.Errorf("64 peers: %v", err)
	}
}

// TestDecodeStatus turns status words into the TimeoutError the host
// twin would return.
func TestDecodeStatus(t *testing.T) {
	if err := decodeStatus([statusWords]uint32{}); err != nil {
		t.Errorf("empty status: %v", err)
	}
	waited := uint64(5*time.Second + 7)
	err := decodeStatus([statusWords]uint32{1, uint32(SignalPut), 1, 0, 2, 9, uint32(waited), uint32(waited >> 32)})
	var te *TimeoutError
	if !errors.As(err, &te) || !errors.Is(err, ErrTimeout) || te.Op != SignalPut || !te.Consume || te.Rank != 0 || te.Peer != 2 ||
		te.Channel != 9 || te.Waited != time.Duration(waited) {
		t.Fatalf("decoded %#v", err)
	}
	if want := "symm: rank 0 put on channel 9: rank 2 has not consumed the previous signal after 5s"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message %q, want it to start with %q", err, want)
	}
}
