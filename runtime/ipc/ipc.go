// Package ipc gives every rank of a group the device addresses of every
// other rank's buffer, whether the ranks are goroutines of one process (one
// GPU each) or separate processes.
//
// Each rank publishes, through a rendezvous.Store, its process id, a
// per-process nonce, its GPU's PCI bus id and ordinal, the buffer's address
// and offset in its allocation, and where to collect the allocation's CUDA
// IPC handle: an abstract Unix socket that hands the handle only to
// processes of the same user (SO_PEERCRED, package fdpass), never through
// the store. A peer in the same process (same nonce) is used directly after
// peer access is enabled: CUDA refuses to open an IPC handle in the process
// that exported it. A peer in another process is mapped with
// cuIpcOpenMemHandle (lazy peer access). Either way Mapping.Peers()[r] is an
// address rank r's buffer has in this rank's context.
//
// Ranks of one group in different processes must therefore run as one user
// and share a network namespace (abstract socket names are per namespace),
// as symmetric memory's descriptor exchange requires too.
package ipc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// processNonce tells ranks of this process from ranks of another process
// that happens to reuse the pid (containers) or to run on another host.
var processNonce = func() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("ipc: no randomness for the process nonce: %v", err))
	}
	return hex.EncodeToString(b[:])
}()

// record is what each rank publishes.
type record struct {
	Rank    int    `json:"rank"`
	PID     int    `json:"pid"`
	Nonce   string `json:"nonce"`
	Ordinal int    `json:"ordinal"`
	Bus     string `json:"bus"`
	Base    uint64 `json:"base"`   // allocation base in the exporter's context
	Offset  uint64 `json:"offset"` // ptr - base
	Ptr     uint64 `json:"ptr"`
	Bytes   int    `json:"bytes"`
	// Where ranks of other processes collect the IPC handle (handout).
	Sock     string `json:"sock"`
	Instance string `json:"instance"`
}

// Mapping is one rank's view of every rank's buffer. Close it before the
// exporting ranks free their buffers (a barrier after Close, then Free).
type Mapping struct {
	rank, world int
	dev         *cuda.Device
	peers       []cuda.DevicePtr
	opened      []cuda.DevicePtr // IPC-opened bases to close
	peerDevs    []*cuda.Device   // devices opened for in-process peers
	closeOnce   sync.Once
	closeErr    error
}

// Exchange publishes this rank's buffer [ptr, ptr+bytes) on dev under key
// and maps every other rank's buffer. It is collective: all world ranks must
// call it with the same key and bytes, and it waits (honouring ctx, or
// rendezvous.DefaultTimeout when ctx has no deadline) until all have
// published and every rank of another process has collected this rank's
// handle, so the socket serving it lives no longer than Exchange.
//
// ptr need not be the base of its allocation: the allocation is found with
// cuMemGetAddressRange, its base exported (cuIpcGetMemHandle only accepts
// bases) and the offset re-applied by the importers. The allocation must
// come from cuMemAlloc (Device.Alloc), not from a pool or VMM mapping.
//
// Errors name the pair of ranks (and devices) that cannot reach each other.
func Exchange(ctx context.Context, store rendezvous.Store, key string, rank, world int,
	dev *cuda.Device, ptr cuda.DevicePtr, bytes int) (*Mapping, error) {
	if world <= 0 || rank < 0 || rank >= world {
		return nil, fmt.Errorf("ipc: rank %d out of range for world %d: %w", rank, world, ErrInvalidArgument)
	}
	if dev == nil {
		return nil, fmt.Errorf("ipc: rank %d: no device (nil *cuda.Device): %w", rank, ErrInvalidArgument)
	}
	if bytes <= 0 {
		// Checked here: a negative size wrapped the overrun check below
		// (off+uint64(bytes)) and was published to every peer.
		return nil, fmt.Errorf("ipc: rank %d: buffer of %d bytes: want a positive size: %w", rank, bytes, ErrInvalidArgument)
	}
	base, size, err := dev.AddressRange(ptr)
	if err != nil {
		return nil, fmt.Errorf("ipc: rank %d: buffer %#x is not device memory: %w", rank, uintptr(ptr), err)
	}
	off := uint64(ptr - base)
	if off+uint64(bytes) > uint64(size) {
		return nil, fmt.Errorf("ipc: rank %d: buffer %#x+%d overruns its allocation (%#x, %d bytes)", rank, uintptr(ptr), bytes, uintptr(base), size)
	}
	h, err := dev.IPCGetMemHandle(base)
	if err != nil {
		return nil, fmt.Errorf("ipc: rank %d: export: %w", rank, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rendezvous.DefaultTimeout)
		defer cancel()
	}
	dl, _ := ctx.Deadline()
	left := time.Until(dl)
	if left <= 0 { // the handout's connections need a positive bound
		return nil, fmt.Errorf("ipc: rank %d: exchange under %q: %w", rank, key, context.DeadlineExceeded)
	}
	ho, err := newHandout(rank, world, h[:], left)
	if err != nil {
		return nil, fmt.Errorf("ipc: rank %d: serve its IPC handle: %w", rank, err)
	}
	defer ho.Close()
	me := record{Rank: rank, PID: os.Getpid(), Nonce: processNonce, Ordinal: dev.Ordinal, Bus: dev.PCIBusID,
		Base: uint64(base), Offset: off, Ptr: uint64(ptr), Bytes: bytes, Sock: ho.addr(), Instance: ho.instance}
	data, err := json.Marshal(me)
	if err != nil {
		return nil, err
	}
	if err := store.Set(ctx, recordKey(key, rank), data); err != nil {
		return nil, fmt.Errorf("ipc: rank %d: publish: %w", rank, err)
	}

	m := &Mapping{rank: rank, world: world, dev: dev, peers: make([]cuda.DevicePtr, world)}
	m.peers[rank] = ptr
	others := map[int]bool{} // ranks of other processes, who collect this rank's handle
	for r := 0; r < world; r++ {
		if r == rank {
			continue
		}
		data, err := store.Get(ctx, recordKey(key, r))
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("ipc: rank %d waiting for rank %d: %w", rank, r, err)
		}
		var peer record
		if err := json.Unmarshal(data, &peer); err != nil {
			m.Close()
			return nil, fmt.Errorf("ipc: rank %d: bad record from rank %d: %w", rank, r, err)
		}
		if peer.Bytes != bytes {
			m.Close()
			return nil, fmt.Errorf("ipc: rank %d (device %d) and rank %d (device %d): buffer sizes differ (%d vs %d bytes)",
				rank, dev.Ordinal, r, peer.Ordinal, bytes, peer.Bytes)
		}
		var handle cuda.IPCHandle
		if peer.Nonce != processNonce {
			others[r] = true
			if err := collect(ctx, peer, rank, &handle); err != nil {
				m.Close()
				return nil, fmt.Errorf("ipc: rank %d (device %d, pid %d) cannot collect the IPC handle of rank %d (device %d, pid %d) from %q (ranks of other processes must run as one user, in one network namespace): %w",
					rank, dev.Ordinal, os.Getpid(), r, peer.Ordinal, peer.PID, peer.Sock, err)
			}
		}
		p, err := m.mapPeer(peer, handle)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("ipc: rank %d (device %d, pid %d) cannot reach rank %d (device %d, pid %d): %w",
				rank, dev.Ordinal, os.Getpid(), r, peer.Ordinal, peer.PID, err)
		}
		m.peers[r] = p
	}
	// The handout closes when Exchange returns: wait until every rank of
	// another process has collected this rank's handle.
	if err := ho.waitServed(ctx, others); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// collect fetches peer's IPC handle from its handout into h.
func collect(ctx context.Context, peer record, rank int, h *cuda.IPCHandle) error {
	if peer.Sock == "" {
		return errors.New("its record names no socket")
	}
	b, err := fetchHandle(ctx, peer.Sock, peer.Instance, rank)
	if err != nil {
		return err
	}
	if len(b) != len(h) {
		return fmt.Errorf("got %d bytes, want a %d-byte handle", len(b), len(h))
	}
	copy(h[:], b)
	return nil
}

// Forget deletes the records Exchange published under key for ranks 0 to
// world-1. Call it once every rank's Exchange has returned (a rank still
// reading a record would wait until its deadline): comm's last rank to
// leave a group does. The records go rendezvous.KeysInFlight at a time
// (rendezvous.DeleteKeys): records already gone are not an error, and the
// error names the first record not deleted, after every record was tried.
func Forget(ctx context.Context, store rendezvous.Store, key string, world int) error {
	keys := make([]string, max(world, 0))
	for r := range keys {
		keys[r] = recordKey(key, r)
	}
	return rendezvous.DeleteKeys(ctx, store, keys...)
}

func recordKey(key string, rank int) string { return fmt.Sprintf("%s/ipc/rank%d", key, rank) }

// ErrInvalidArgument is wrapped by Exchange's refusals of its own
// arguments (rank or world out of range, no device, a size that is not
// positive), which no peer is told of: the caller's mistake to fix.
var ErrInvalidArgument = errors.New("ipc: invalid argument")

// errNoP2P is wrapped when two GPUs have no peer access.
var errNoP2P = errors.New("no peer-to-peer access between the GPUs")

// mapPeer returns peer's buffer address in m.dev's context.
// handle is the peer's IPC handle when it is in another process.
func (m *Mapping) mapPeer(peer record, handle cuda.IPCHandle) (cuda.DevicePtr, error) {
	// The peer's GPU as this process numbers it (CUDA_VISIBLE_DEVICES may
	// differ between processes); -1 when this process cannot see it.
	local := -1
	if peer.Nonce == processNonce {
		local = peer.Ordinal
	} else if peer.Bus != "" {
		if o, err := cuda.OrdinalByPCIBusID(peer.Bus); err == nil {
			local = o
		}
	}
	if local >= 0 && local != m.dev.Ordinal {
		pd, err := cuda.Open(local)
		if err != nil {
			return 0, err
		}
		m.peerDevs = append(m.peerDevs, pd)
		ok, err := m.dev.CanAccessPeer(pd)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, errNoP2P
		}
		if peer.Nonce == processNonce {
			if err := m.dev.EnablePeerAccess(pd); err != nil {
				return 0, err
			}
		}
	}
	if peer.Nonce == processNonce {
		return cuda.DevicePtr(peer.Ptr), nil
	}
	base, err := m.dev.IPCOpenMemHandle(handle)
	if err != nil {
		return 0, fmt.Errorf("open IPC handle: %w", err)
	}
	m.opened = append(m.opened, base)
	return base + cuda.DevicePtr(peer.Offset), nil
}

// Peers returns every rank's buffer address usable from this rank's device,
// indexed by rank (this rank's own entry is its ptr). The slice is shared:
// do not modify it.
func (m *Mapping) Peers() []cuda.DevicePtr { return m.peers }

// Rank returns this rank.
func (m *Mapping) Rank() int { return m.rank }

// WorldSize returns the number of ranks.
func (m *Mapping) WorldSize() int { return m.world }

// Close unmaps the handles this rank opened and drops its references to
// peer devices. It does not free this rank's own buffer (the caller owns
// it) and touches no other rank. Idempotent.
func (m *Mapping) Close() error {
	m.closeOnce.Do(func() {
		var errs []error
		for _, p := range m.opened {
			if err := m.dev.IPCCloseMemHandle(p); err != nil {
				errs = append(errs, err)
			}
		}
		for _, d := range m.peerDevs {
			d.Close()
		}
		m.opened, m.peerDevs = nil, nil
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}
