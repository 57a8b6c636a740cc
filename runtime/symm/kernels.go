//go:build linux && (amd64 || arm64)

package symm

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/collgen/collgen/runtime/symm/kernels"
)

// KernelGroupBytes is the size of cg_symm_group (collgen_symm.cuh), the
// by-value argument Handle.KernelGroup fills for users' kernels.
const KernelGroupBytes = 56

// DeviceHeaderName is the name under which kernels include DeviceHeader:
// #include "collgen_symm.cuh".
const DeviceHeaderName = "collgen_symm.cuh"

// DeviceHeader is collgen_symm.cuh, the device side of symmetric memory for
// kernels: the cg_symm_group argument (Handle.KernelGroup builds it) and
// cg_symm_put, cg_symm_wait and cg_symm_barrier on the signal pads, with
// deadlines reported through a StreamOrdering's status words. It is
// written once, in runtime/symm/kernels (which `collgen generate` copies to
// generated/cuda/ under the generated-file marker), and is what
// CompileKernel lets a kernel include.
var DeviceHeader = kernels.SymmHeader

// signalSource is the kernel behind stream-ordered signals on the CUDA
// backend (cg_symm_signal; cuda_signal.go lays out its argument).
//
//go:embed kernels/signal.cu
var signalSource string

// MaxStreamPeers is the most peers one stream-ordered signal operation can
// name (the signal kernel's argument holds that many addresses), so
// stream-ordered barriers need WorldSize ≤ MaxStreamPeers + 1.
const MaxStreamPeers = 63

// Layout of the signal kernel's argument (struct cg_symm_signal_args in
// kernels/signal.cu, whose static_assert checks the size).
const (
	sigPutOff     = 0
	sigWaitOff    = sigPutOff + 8*MaxStreamPeers
	sigPeersOff   = sigWaitOff + 8*MaxStreamPeers
	sigNPeersOff  = sigPeersOff + 4*MaxStreamPeers
	sigOpOff      = sigNPeersOff + 4
	sigRankOff    = sigOpOff + 4
	sigChannelOff = sigRankOff + 4
	sigTimeoutOff = 1280 // sigChannelOff + 4, aligned to 8
	sigStatusOff  = sigTimeoutOff + 8
	sigBrokenOff  = sigStatusOff + 8
	sigArgsBytes  = sigBrokenOff + 8 // 1304
)

// statusWords is the number of 4-byte status words (CG_SYMM_STATUS_WORDS).
const statusWords = 8

// signalArgs lays out op as the signal kernel's argument, with the
// ordering's status words and sticky word (device addresses), in the
// first sigArgsBytes of buf (a buffer reused from one operation to the
// next: everything op does not set is zeroed), and returns that part.
func signalArgs(buf []byte, op *SignalOp, status, broken uint64) ([]byte, error) {
	if len(op.Peers) > MaxStreamPeers {
		return nil, fmt.Errorf("symm: a stream-ordered %s names %d peers; the CUDA backend's signal kernel takes at most %d (world size %d)",
			op.Kind, len(op.Peers), MaxStreamPeers, MaxStreamPeers+1)
	}
	a := buf[:sigArgsBytes]
	clear(a)
	le := binary.LittleEndian
	for i, p := range op.Peers {
		if i < len(op.Put) {
			le.PutUint64(a[sigPutOff+8*i:], uint64(op.Put[i]))
		}
		if i < len(op.Wait) {
			le.PutUint64(a[sigWaitOff+8*i:], uint64(op.Wait[i]))
		}
		le.PutUint32(a[sigPeersOff+4*i:], uint32(p))
	}
	le.PutUint32(a[sigNPeersOff:], uint32(len(op.Peers)))
	le.PutUint32(a[sigOpOff:], uint32(op.Kind))
	le.PutUint32(a[sigRankOff:], uint32(op.Rank))
	le.PutUint32(a[sigChannelOff:], uint32(op.Channel))
	le.PutUint64(a[sigTimeoutOff:], uint64(op.Timeout.Nanoseconds()))
	le.PutUint64(a[sigStatusOff:], status)
	le.PutUint64(a[sigBrokenOff:], broken)
	return a, nil
}

// decodeStatus turns the status words a device operation wrote
// (CG_SYMM_STATUS_WORDS in collgen_symm.cuh) into its *TimeoutError, or
// nil when word 0 says nothing was reported.
func decodeStatus(w [statusWords]uint32) error {
	if w[0] == 0 {
		return nil
	}
	return &TimeoutError{Op: SignalKind(w[1]), Consume: w[2] != 0, Rank: int(w[3]), Peer: int(w[4]), Channel: int(w[5]),
		Waited: time.Duration(uint64(w[7])<<32 | uint64(w[6]))}
}
