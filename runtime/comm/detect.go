package comm

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// Topology detection: New finds out what the group's GPUs are before it
// picks a spec topology. Every rank publishes its GPU's PCI bus id; every
// rank then classifies the whole set with NVML (runtime/topo, through the
// device) or, where NVML cannot be used, probes peer access from its own
// GPU to every other (cuDeviceCanAccessPeer). A second exchange gathers
// those views, and every rank reduces them to one detection by the same
// rule (combineViews), so all ranks take the same path, the NCCL-only one
// included, without a rank failing while others wait at a barrier.
//
// The pure part lives here; runtime/topo needs cgo (go-nvml), so the device
// reaches it (detect_cuda.go) and this file only sees a classification.

// kindNone is runtime/topo's NoPeerAccess.
const kindNone = "none"

// classification is runtime/topo's Classification in comm's terms.
type classification struct {
	// Kind is runtime/topo's kind (nvswitch, nvlink_mesh,
	// hybrid_cube_mesh, pcie_p2p, none).
	Kind string `json:"kind"`
	// Spec is the spec topology kind whose kernels run there ("" for none).
	Spec coll.TopologyKind `json:"spec,omitempty"`
	// Corners[rank] is the hcm schedule rank (cube corner) that rank plays;
	// hybrid_cube_mesh only.
	Corners []int `json:"corners,omitempty"`
	// Reason says why, in one line.
	Reason string `json:"reason"`
}

// Peer access of one rank's GPU to another's, as probed through CUDA.
const (
	peerNo      = 0
	peerYes     = 1
	peerUnknown = 2 // the peer is not visible to this process
)

// detectView is what one rank found, published in the second exchange.
type detectView struct {
	// NVML is this rank's classification, nil where NVML could not be used.
	NVML *classification `json:"nvml,omitempty"`
	// NoNVML says why NVML could not be used ("" when it was).
	NoNVML string `json:"no_nvml,omitempty"`
	// Peers[p] is this rank's peer access to rank p, probed when NVML could
	// not be used.
	Peers []int `json:"peers,omitempty"`
	// ProbeErr says why probing failed.
	ProbeErr string `json:"probe_err,omitempty"`
}

// Detected describes what New found the group's GPUs to be and which spec
// topology it chose (Communicator.Detected).
type Detected struct {
	// Topology is the spec topology in use; "" when no generated kernel
	// can run on these GPUs and every collective goes to NCCL.
	Topology string
	// Kind is what the GPUs are (runtime/topo's kind: nvswitch,
	// nvlink_mesh, hybrid_cube_mesh, pcie_p2p, none); "peer_access" when
	// NVML could not be used and CUDA found peer access between every pair
	// (which says nothing about the links); "" when nothing was detected
	// (world size 1).
	Kind string
	// SpecKind is the spec topology kind whose kernels are made for that
	// kind of GPUs; "" for none and peer_access.
	SpecKind coll.TopologyKind
	// Corners is set on a hybrid cube mesh: Corners[rank] is the cube
	// corner (hcm schedule rank) that rank's GPU plays.
	Corners []int
	// BusIDs are the ranks' GPUs, by rank.
	BusIDs []string
	// Reason says in one line why this kind, and why this topology.
	Reason string
	// NoNVML says why NVML could not be used (the lowest such rank's
	// reason), "" when every rank used it.
	NoNVML string
}

// describe is the kind and the reason, "kind: reason", or the reason
// alone when nothing was detected.
func (d *Detected) describe() string {
	if d.Kind == "" {
		return d.Reason
	}
	return d.Kind + ": " + d.Reason
}

// addReason appends one clause to Reason ("; " between clauses).
func (d *Detected) addReason(s string) {
	if d.Reason != "" {
		d.Reason += "; "
	}
	d.Reason += s
}

// kindProbed is Detected.Kind when only CUDA's peer-access probe was used.
const kindProbed = "peer_access"

// detect runs the two exchanges and returns the agreed detection (nil for
// world size 1: no peers, nothing to detect).
func detect(ctx context.Context, cfg Config, prefix string, dev device) (*Detected, error) {
	if cfg.WorldSize == 1 {
		return nil, nil
	}
	bus, err := dev.busID()
	if err != nil {
		// Publish the failure, so every rank stops here together.
		bus = "error: " + err.Error()
	}
	all, err := rendezvous.AllGather(ctx, cfg.Store, prefix+"detect/bus", cfg.Rank, cfg.WorldSize, []byte(bus))
	if err != nil {
		return nil, classify(fmt.Errorf("comm: rank %d: exchange GPU bus ids: %w", cfg.Rank, err))
	}
	ids := make([]string, len(all))
	for r, b := range all {
		ids[r] = string(b)
	}
	for r, id := range ids {
		if strings.HasPrefix(id, "error: ") {
			return nil, errorf(ErrDevice, "comm: rank %d cannot read its GPU's PCI bus id: %s", r, strings.TrimPrefix(id, "error: "))
		}
	}
	view := localView(cfg.Rank, ids, dev)
	views, err := gatherJSON(ctx, cfg.Store, prefix+"detect/view", cfg.Rank, cfg.WorldSize, view, "topology detection")
	if err != nil {
		return nil, classify(fmt.Errorf("comm: rank %d: exchange topology detection: %w", cfg.Rank, err))
	}
	d, err := combineViews(ids, views)
	if err != nil {
		return nil, err
	}
	d.BusIDs = ids
	return d, nil
}

// localView classifies the group's GPUs with NVML, or probes peer access
// where NVML cannot be used. Ranks sharing a GPU skip NVML (it classifies
// distinct GPUs only); a GPU can always read itself.
func localView(rank int, ids []string, dev device) detectView {
	var v detectView
	if dup := firstRepeat(ids); dup != "" {
		v.NoNVML = fmt.Sprintf("several ranks use GPU %s, which NVML cannot classify", dup)
	} else if c, err := dev.classify(ids); err != nil {
		v.NoNVML = err.Error()
	} else {
		v.NVML = &c
		return v
	}
	peers, err := dev.canAccessPeers(ids)
	if err == nil && len(peers) != len(ids) {
		err = fmt.Errorf("probed %d GPUs, want %d", len(peers), len(ids))
	}
	if err != nil {
		v.ProbeErr = fmt.Sprintf("rank %d: %v", rank, err)
	}
	v.Peers = peers
	return v
}

// firstRepeat returns the first bus id named twice, or "".
func firstRepeat(ids []string) string {
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			return id
		}
		seen[id] = true
	}
	return ""
}

// combineViews is the rule every rank applies to the same views, so all
// reach the same detection:
//
//   - NVML classifications must agree (they are of the same GPUs); the
//     lowest rank's is the detection.
//   - A rank that probed instead votes: if its GPU cannot access some
//     peer's, the group has no peer access (NCCL only), whatever NVML
//     said elsewhere.
//   - With no NVML classification at all and every probe positive (or
//     unknown: the peer is hidden from that process), the kind is
//     kindProbed.
func combineViews(ids []string, views []detectView) (*Detected, error) {
	d := &Detected{}
	var ref *classification
	refRank := -1
	for r, v := range views {
		if v.ProbeErr != "" {
			return nil, errorf(ErrDevice, "comm: probing peer access failed on %s (NVML could not be used: %s)", v.ProbeErr, v.NoNVML)
		}
		if v.NoNVML != "" && d.NoNVML == "" {
			d.NoNVML = fmt.Sprintf("rank %d: %s", r, v.NoNVML)
		}
		if v.NVML == nil {
			continue
		}
		if ref == nil {
			ref, refRank = v.NVML, r
			continue
		}
		if v.NVML.Kind != ref.Kind || !slices.Equal(v.NVML.Corners, ref.Corners) {
			return nil, errorf(ErrMismatch, "comm: NVML classifies the GPUs %v as %s (corners %v) on rank %d but as %s (corners %v) on rank %d; are the ranks on one machine?",
				ids, ref.Kind, ref.Corners, refRank, v.NVML.Kind, v.NVML.Corners, r)
		}
	}
	for r, v := range views {
		for p, a := range v.Peers {
			if p != r && a == peerNo {
				d.Kind = kindNone
				d.Reason = fmt.Sprintf("rank %d's GPU (%s) cannot access rank %d's GPU (%s) (cuDeviceCanAccessPeer)", r, ids[r], p, ids[p])
				return d, nil
			}
		}
	}
	if ref != nil {
		d.Kind, d.SpecKind, d.Corners, d.Reason = ref.Kind, ref.Spec, ref.Corners, ref.Reason
		return d, nil
	}
	d.Kind, d.Reason = kindProbed, "NVML could not be used; CUDA reports peer access between every pair of GPUs"
	return d, nil
}

// runs reports whether kernels of spec kind k run correctly on the
// detected GPUs: every pair the kind's schedules read must have peer
// access (all pairs, except on a hybrid cube mesh: its NVLinks).
func (d *Detected) runs(k coll.TopologyKind) bool {
	if d == nil {
		return true // world 1, or not detected: nothing to check
	}
	allPairs := d.Kind == kindProbed || d.SpecKind == coll.NVLinkFull || d.SpecKind == coll.PCIeP2P
	if k == coll.HybridCubeMesh {
		return allPairs || d.SpecKind == coll.HybridCubeMesh
	}
	return allPairs
}

// chooseTopology picks the spec topology for the detection among names
// (the library's GPU topologies at this world size, in spec order, with
// their kinds): the first of the detected kind; on NVLink with no
// nvlink_full topology, the first pcie_p2p one (its kernels read every
// pair, which NVLink serves; its rules were made for PCIe), with the
// reason added to d; with only a probe, the first nvlink_full one, else
// the first in spec order (as before detection); "" (NCCL only) when the
// GPUs lack peer access or the library has no topology that runs on
// them, with the reason added to d.
func chooseTopology(d *Detected, names []string, kinds map[string]coll.TopologyKind) string {
	if d == nil || d.Kind == kindProbed {
		for _, n := range names {
			if kinds[n] == coll.NVLinkFull {
				return n
			}
		}
		return names[0]
	}
	want := d.SpecKind
	if want == "" {
		d.addReason("every collective uses NCCL")
		return ""
	}
	for _, n := range names {
		if kinds[n] == want {
			return n
		}
	}
	if want == coll.NVLinkFull {
		for _, n := range names {
			if kinds[n] == coll.PCIeP2P {
				d.addReason(fmt.Sprintf("the library has no %s topology at this world size, so %s's %s kernels run over NVLink (their size rules were made for PCIe): `collgen topo --spec FILE --base spec` writes one for this machine; regenerate with it", want, n, coll.PCIeP2P))
				return n
			}
		}
	}
	d.addReason(fmt.Sprintf("the library has no %s topology at this world size (have %v), so every collective uses NCCL: `collgen topo --spec FILE --base spec` writes one for this machine; regenerate with it", want, names))
	return ""
}

// checkExplicit refuses a Config.Topology whose kernels cannot run on the
// detected GPUs (all ranks refuse alike: the detection is agreed).
func checkExplicit(d *Detected, name string, kind coll.TopologyKind) error {
	if d.runs(kind) {
		return nil
	}
	return errorf(ErrUnsupported, "comm: Config.Topology %q (%s) cannot run on these GPUs, detected as %s: %s; leave Config.Topology empty to let the communicator choose",
		name, kind, d.Kind, d.Reason)
}

// cornerOrder returns the cube corner each rank plays when the hcm
// kernels need another rank order than the communicator's, and the rank
// at each corner; nil, nil when the order is the identity.
func (g *gpuComm) cornerOrder() (corner, atCorner []int) {
	if g.det == nil || g.kind != coll.HybridCubeMesh || slices.Equal(g.det.Corners, identity(len(g.det.Corners))) {
		return nil, nil
	}
	atCorner = make([]int, len(g.det.Corners))
	for r, c := range g.det.Corners {
		atCorner[c] = r
	}
	return g.det.Corners, atCorner
}

// identity is 0, 1, ..., n-1.
func identity(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// kernelRank is the rank the kernels of this communicator see: its cube
// corner on a remapped hybrid cube mesh, else its own.
func (g *gpuComm) kernelRank() int {
	if g.corner != nil {
		return g.corner[g.cfg.Rank]
	}
	return g.cfg.Rank
}

// rankAt is the communicator rank that plays kernel rank k (the inverse of
// kernelRank; the identity unless remapped).
func (g *gpuComm) rankAt(k int) int {
	if g.atCorner != nil {
		return g.atCorner[k]
	}
	return k
}

// byCorner reorders a by-rank table of peer addresses into kernel-rank
// order (identity unless remapped). Every kernel of a remapped
// communicator sees the same order, so signal pads and stage slots stay
// consistent across kernels.
func (g *gpuComm) byCorner(byRank []cuda.DevicePtr) []cuda.DevicePtr {
	out := make([]cuda.DevicePtr, len(byRank))
	for k := range out {
		out[k] = byRank[g.rankAt(k)]
	}
	return out
}

// kernelRefusal says why no generated kernel may run cl: the GPUs lack
// peer access (NCCL only), or the ranks play other cube corners, which
// only all-reduce tolerates (every rank gets the same result whichever
// corner it plays; reduce-scatter and all-gather place data by rank).
func (g *gpuComm) kernelRefusal(cl *call) error {
	if g.ncclOnly() {
		return errorf(ErrUnsupported, "comm: %s with algorithm %s refused: no generated kernel runs here (%s)", cl.collective, cl.alg, g.det.describe())
	}
	if c := g.corner; c != nil && cl.collective != coll.AllReduce {
		return errorf(ErrUnsupported, "comm: %s with algorithm %s refused: the ranks play the hybrid cube mesh's corners %v (by rank), and only all-reduce kernels run in that order; order Config.Device by corner or use nccl",
			cl.collective, cl.alg, c)
	}
	return nil
}

// Detected returns what New found the GPUs to be and the topology it
// chose; zero on the host backend. On a group spanning hosts it is this
// host's: its ranks' detection and topology, by local index (BusIDs,
// Corners), which the host steps of the hierarchical collectives run;
// zero with one rank per host (those steps are copies).
func (c *Communicator) Detected() Detected {
	if c.hier != nil {
		if c.hier.intra == nil {
			return Detected{}
		}
		d := c.hier.intra.Detected()
		l := c.hier.layout
		d.addReason(fmt.Sprintf("the group spans %d hosts: this is host %q's %d ranks, by local index; NCCL connects the hosts",
			len(l.hosts), l.ids[l.host[c.cfg.Rank]], l.perHost()))
		return d
	}
	if c.gpu == nil || c.gpu.det == nil {
		if c.gpu != nil {
			return Detected{Topology: c.gpu.topology}
		}
		return Detected{}
	}
	d := *c.gpu.det
	d.Topology = c.gpu.topology
	return d
}
