package topo

import (
	"fmt"

	"github.com/collgen/collgen/coll"
)

// Kind is what Classify finds a set of GPUs to be.
type Kind string

// Kinds, strongest first: Classify returns the first that holds.
const (
	// NVSwitch: every GPU has NVLinks into an NVSwitch fabric, so every
	// pair is joined through the switches (HGX/DGX A100, H100, H200).
	NVSwitch Kind = "nvswitch"
	// NVLinkMesh: every pair of GPUs is joined by a direct NVLink (a 2-GPU
	// NVLink bridge, a 4-GPU fully connected board, a quad of a DGX-1).
	NVLinkMesh Kind = "nvlink_mesh"
	// HybridCubeMesh: 8 GPUs in two fully connected quads, each GPU also
	// linked to its counterpart in the other quad (DGX-1).
	HybridCubeMesh Kind = "hybrid_cube_mesh"
	// PCIe: every pair can read each other's memory, but not all over
	// NVLink: peer-to-peer over PCIe (or partly over NVLink).
	PCIe Kind = "pcie_p2p"
	// NoPeerAccess: some pair cannot read each other's memory (or there is
	// only one GPU); only NCCL or host staging can move data.
	NoPeerAccess Kind = "none"
)

// SpecKind returns the spec topology kind whose kernels run on k, and false
// for NoPeerAccess (no generated GPU kernel can run there).
func (k Kind) SpecKind() (coll.TopologyKind, bool) {
	switch k {
	case NVSwitch, NVLinkMesh:
		return coll.NVLinkFull, true
	case HybridCubeMesh:
		return coll.HybridCubeMesh, true
	case PCIe:
		return coll.PCIeP2P, true
	}
	return "", false
}

// Classification is what a set of GPUs is, for the ranks that run on them.
type Classification struct {
	// Kind is the strongest kind that holds for every pair.
	Kind Kind
	// GPUs are the classified GPUs' bus ids in rank order, as given.
	GPUs []BusID
	// Reason says in one line why the set is of this kind and, for a kind
	// weaker than NVLink, which pair keeps it from a stronger one.
	Reason string
	// Corners is set for HybridCubeMesh only: Corners[rank] is the rank of
	// the hcm schedule (schedule.NewTopology(hybrid_cube_mesh, 8): quads
	// {0..3} and {4..7}, links i <-> i^4) that this rank's GPU must play,
	// so that every read the schedule makes uses an NVLink. It is the
	// identity when the ranks are already in cube order (NVML's order on a
	// DGX-1). All-reduce gives every rank the same result whichever corner
	// it plays, so the communicator launches the hcm kernel with rank
	// Corners[r] and its peer table indexed by corner.
	Corners []int
}

// Remapped reports whether some rank plays another corner than its own
// rank number (only for HybridCubeMesh).
func (c *Classification) Remapped() bool {
	for r, k := range c.Corners {
		if r != k {
			return true
		}
	}
	return false
}

// Classify says what the GPUs at the given bus ids, in rank order, are.
// With no ids it classifies every GPU of the machine in NVML index order.
// An id that is not a GPU of m wraps ErrUnknownGPU; a repeated id is an
// error too.
func (m *Machine) Classify(ids ...BusID) (*Classification, error) {
	idx, err := m.indices(ids)
	if err != nil {
		return nil, err
	}
	c := &Classification{}
	for _, i := range idx {
		c.GPUs = append(c.GPUs, m.GPUs[i].BusID)
	}
	c.Kind, c.Reason, c.Corners = m.classify(idx)
	return c, nil
}

// indices maps bus ids to GPU indices; none means all GPUs.
func (m *Machine) indices(ids []BusID) ([]int, error) {
	if len(ids) == 0 {
		idx := make([]int, len(m.GPUs))
		for i := range idx {
			idx[i] = i
		}
		return idx, nil
	}
	idx := make([]int, 0, len(ids))
	seen := map[BusID]int{}
	for r, b := range ids {
		i := m.GPU(b)
		if i < 0 {
			return nil, fmt.Errorf("topo: rank %d's GPU %s: %w on this machine (NVML sees %s)", r, b, ErrUnknownGPU, m.busList())
		}
		if prev, ok := seen[b]; ok {
			return nil, fmt.Errorf("topo: ranks %d and %d both name GPU %s; every rank needs its own GPU", prev, r, b)
		}
		seen[b] = r
		idx = append(idx, i)
	}
	return idx, nil
}

// busList lists the machine's bus ids for messages.
func (m *Machine) busList() string {
	if len(m.GPUs) == 0 {
		return "no GPUs"
	}
	s := ""
	for i, g := range m.GPUs {
		if i > 0 {
			s += ", "
		}
		s += g.BusID.String()
	}
	return s
}

// classify finds the kind of the GPUs idx (in rank order), why, and the
// cube corners for a hybrid cube mesh.
func (m *Machine) classify(idx []int) (Kind, string, []int) {
	n := len(idx)
	if n < 2 {
		return NoPeerAccess, fmt.Sprintf("%d GPU: no peers to access", n), nil
	}
	// A MIG instance has no peer access to any other GPU, whatever NVML's
	// P2P status of the whole GPU says.
	for _, i := range idx {
		if m.GPUs[i].MIG {
			return NoPeerAccess, fmt.Sprintf("GPU %d (%s) has MIG enabled: its instances have no peer access to other GPUs", m.GPUs[i].Index, m.GPUs[i].BusID), nil
		}
	}
	// Peer reads must work both ways between every pair, whatever the link,
	// except on a hybrid cube mesh, which reads only over its NVLinks.
	noPeer := ""
	for a := 0; a < n && noPeer == ""; a++ {
		for b := 0; b < n; b++ {
			i, j := idx[a], idx[b]
			if p := m.Pairs[i][j]; a != b && p.Read != P2POK {
				noPeer = fmt.Sprintf("GPU %d (%s) cannot read GPU %d (%s): peer access %s (%s)",
					m.GPUs[i].Index, m.GPUs[i].BusID, m.GPUs[j].Index, m.GPUs[j].BusID, p.Read.Describe(), p.Level)
				break
			}
		}
	}
	allSwitch, allDirect := true, true
	var notDirect [2]int
	for a := 0; a < n; a++ {
		if m.GPUs[idx[a]].SwitchLinks() == 0 {
			allSwitch = false
		}
		for b := a + 1; b < n; b++ {
			if !m.direct(idx[a], idx[b]) && allDirect {
				allDirect, notDirect = false, [2]int{idx[a], idx[b]}
			}
		}
	}
	// Every GPU on the switches, but some pair kept apart on them (a
	// partitioned fabric): peer reads, if any, go over PCIe.
	apart := ""
	for a := 0; a < n && allSwitch && apart == ""; a++ {
		for b := a + 1; b < n && apart == ""; b++ {
			apart = m.switchApart(idx[a], idx[b])
		}
	}
	switch {
	case noPeer == "" && allSwitch && apart == "":
		lo, hi := m.minMaxSwitchLinks(idx)
		links := fmt.Sprintf("%d", lo)
		if hi != lo {
			links = fmt.Sprintf("%d to %d", lo, hi)
		}
		return NVSwitch, fmt.Sprintf("every GPU has NVLinks into the NVSwitch fabric (%s links each)", links), nil
	case noPeer == "" && allDirect:
		return NVLinkMesh, "every pair of GPUs is joined by a direct NVLink", nil
	}
	if n == 8 {
		if corners := m.cubeCorners(idx); corners != nil {
			why := "two fully connected quads of 4 GPUs, each GPU linked to its counterpart in the other quad"
			return HybridCubeMesh, why, corners
		}
	}
	// Weaker than NVLink: say why not a cube, and which links are down.
	var extra string
	if n == 8 {
		extra = "; not a hybrid cube mesh either: the GPUs cannot be placed on the cube's corners with an NVLink on every edge"
	}
	for _, i := range idx {
		if d := m.GPUs[i].DownLinks; d > 0 {
			extra += fmt.Sprintf("; GPU %d (%s) has %d NVLink(s) down", m.GPUs[i].Index, m.GPUs[i].BusID, d)
		}
	}
	if noPeer != "" {
		return NoPeerAccess, noPeer + extra, nil
	}
	if apart != "" {
		return PCIe, "every pair has peer access, but not all over NVLink: " + apart + extra, nil
	}
	i, j := notDirect[0], notDirect[1]
	return PCIe, fmt.Sprintf("every pair has peer access, but GPU %d (%s) and GPU %d (%s) have no NVLink between them (PCIe path %s)%s",
		m.GPUs[i].Index, m.GPUs[i].BusID, m.GPUs[j].Index, m.GPUs[j].BusID, m.Pairs[i][j].Level, extra), nil
}

// minMaxSwitchLinks returns the fewest and most switch links of the GPUs.
func (m *Machine) minMaxSwitchLinks(idx []int) (lo, hi int) {
	for k, i := range idx {
		s := m.GPUs[i].SwitchLinks()
		if k == 0 || s < lo {
			lo = s
		}
		if s > hi {
			hi = s
		}
	}
	return lo, hi
}

// cubeLinked reports whether corners a and b of the hcm schedule's cube
// are linked: the same quad, or counterparts (schedule.NewTopology's
// hybrid_cube_mesh links; a test checks the two agree).
func cubeLinked(a, b int) bool { return a/4 == b/4 || a^4 == b }

// direct reports whether GPUs i and j have a direct NVLink that both ends
// report active (an end that reports none has it down, or cannot name its
// peer), so that the kind does not depend on the order of the ranks.
func (m *Machine) direct(i, j int) bool {
	return m.Pairs[i][j].NVLinks > 0 && m.Pairs[j][i].NVLinks > 0
}

// nvlinkPeers reports whether GPUs i and j have a direct NVLink and can
// read each other's memory.
func (m *Machine) nvlinkPeers(i, j int) bool {
	return m.direct(i, j) && m.Pairs[i][j].Read == P2POK && m.Pairs[j][i].Read == P2POK
}

// cubeCorners finds an assignment of the 8 GPUs idx (in rank order) to the
// cube's corners such that every pair of linked corners has a direct
// NVLink and peer access, and returns Corners[rank], or nil if there is none. Corners are
// filled in order, each with the lowest rank that fits, so the identity
// comes out whenever it works.
func (m *Machine) cubeCorners(idx []int) []int {
	const w = 8
	rankAt := make([]int, w) // rankAt[corner] = rank
	used := make([]bool, w)
	var place func(corner int) bool
	place = func(corner int) bool {
		if corner == w {
			return true
		}
		for r := 0; r < w; r++ {
			if used[r] {
				continue
			}
			ok := true
			for c := 0; c < corner && ok; c++ {
				if cubeLinked(c, corner) && !m.nvlinkPeers(idx[rankAt[c]], idx[r]) {
					ok = false
				}
			}
			if !ok {
				continue
			}
			rankAt[corner], used[r] = r, true
			if place(corner + 1) {
				return true
			}
			used[r] = false
		}
		return false
	}
	if !place(0) {
		return nil
	}
	corners := make([]int, w)
	for c, r := range rankAt {
		corners[r] = c
	}
	return corners
}

// maxSubsetGPUs is the most GPUs WorldKinds enumerates every subset of
// (2^16 subsets); larger machines are classified by index windows only.
const maxSubsetGPUs = 16

// WorldKinds returns, for each kind, the world sizes w (ascending) at which
// some w GPUs of the machine are of that kind: on a DGX-1, NVLinkMesh at 2,
// 3 and 4 (GPUs within a quad), NoPeerAccess at 2 to 7 and HybridCubeMesh
// at 8. Single GPUs are left out. Machines of up to 16 GPUs are searched
// exhaustively; on larger ones only runs of consecutive GPUs are tried.
func (m *Machine) WorldKinds() map[Kind][]int {
	n := len(m.GPUs)
	found := map[Kind]map[int]bool{}
	add := func(idx []int) {
		k, _, _ := m.classify(idx)
		if found[k] == nil {
			found[k] = map[int]bool{}
		}
		found[k][len(idx)] = true
	}
	if n <= maxSubsetGPUs {
		for set := 0; set < 1<<n; set++ {
			var idx []int
			for i := 0; i < n; i++ {
				if set&(1<<i) != 0 {
					idx = append(idx, i)
				}
			}
			if len(idx) >= 2 {
				add(idx)
			}
		}
	} else {
		for w := 2; w <= n; w++ {
			for s := 0; s+w <= n; s++ {
				idx := make([]int, w)
				for k := range idx {
					idx[k] = s + k
				}
				add(idx)
			}
		}
	}
	out := map[Kind][]int{}
	for k, ws := range found {
		for w := 2; w <= n; w++ {
			if ws[w] {
				out[k] = append(out[k], w)
			}
		}
	}
	return out
}
