// Package topo reads a machine's GPU interconnect from NVML (through
// go-nvml, which dlopens libnvidia-ml at run time) and classifies it, or any
// subset of its GPUs, as one of the topology kinds collgen generates kernels
// for: GPUs joined through NVSwitch, a full NVLink mesh, the 8-GPU hybrid
// cube mesh (with the mapping from ranks to the cube's corners that the hcm
// schedule expects), PCIe peer-to-peer, or no peer access at all.
//
// Detection goes through the small Library interface, which go-nvml's
// nvml.Interface and its generated mocks (pkg/nvml/mock) both satisfy, so
// tests run against fake machines without a GPU (package topo/fakenvml).
package topo

import (
	"fmt"
	"strconv"
	"strings"
)

// BusID is a PCI address, domain:bus:device.function. NVML writes it as
// "00000000:07:00.0", CUDA as "0000:07:00.0"; both parse to the same value,
// and String gives the CUDA form in lower case.
type BusID struct {
	Domain   uint32 // PCI domain (segment); 0 on most machines
	Bus      uint8  // PCI bus number
	Device   uint8  // device number on the bus (0-31)
	Function uint8  // function number of the device (0-7)
}

// ParseBusID parses "domain:bus:device.function" (hexadecimal, either case,
// any domain width) or "bus:device.function" (domain 0).
func ParseBusID(s string) (BusID, error) {
	bad := func(why string) (BusID, error) {
		return BusID{}, fmt.Errorf("topo: bad PCI bus id %q: %s; want domain:bus:device.function in hex, e.g. 0000:07:00.0", s, why)
	}
	t := strings.TrimSpace(s)
	parts := strings.Split(t, ":")
	var dom string
	switch len(parts) {
	case 3:
		dom = parts[0]
		parts = parts[1:]
	case 2:
		dom = "0"
	default:
		return bad("wrong number of ':' separators")
	}
	devFn := strings.Split(parts[1], ".")
	if len(devFn) != 2 {
		return bad("no '.' before the function number")
	}
	d, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return bad("domain is not a hex number below 2^32")
	}
	b, err := strconv.ParseUint(parts[0], 16, 8)
	if err != nil {
		return bad("bus is not a hex number below 0x100")
	}
	dev, err := strconv.ParseUint(devFn[0], 16, 8)
	if err != nil || dev > 0x1f {
		return bad("device is not a hex number below 0x20")
	}
	fn, err := strconv.ParseUint(devFn[1], 16, 8)
	if err != nil || fn > 7 {
		return bad("function is not a number from 0 to 7")
	}
	return BusID{Domain: uint32(d), Bus: uint8(b), Device: uint8(dev), Function: uint8(fn)}, nil
}

// ParseBusIDs parses bus ids in rank order (as the communicator gathers
// them from cuda.Device.PCIBusID), for Machine.Classify; the error names
// the rank whose id is bad.
func ParseBusIDs(ids []string) ([]BusID, error) {
	out := make([]BusID, len(ids))
	for r, s := range ids {
		b, err := ParseBusID(s)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		out[r] = b
	}
	return out, nil
}

// String formats the id as CUDA does, in lower case: "0000:07:00.0".
func (b BusID) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", b.Domain, b.Bus, b.Device, b.Function)
}

// Less orders bus ids by domain, bus, device, function.
func (b BusID) Less(o BusID) bool {
	if b.Domain != o.Domain {
		return b.Domain < o.Domain
	}
	if b.Bus != o.Bus {
		return b.Bus < o.Bus
	}
	if b.Device != o.Device {
		return b.Device < o.Device
	}
	return b.Function < o.Function
}

// RemoteKind is what sits at the far end of an NVLink.
type RemoteKind int

// Far ends of an NVLink.
const (
	// RemoteUnknown: NVML could not say.
	RemoteUnknown RemoteKind = iota
	// RemoteGPU: another GPU of this machine, named by Link.Remote.
	RemoteGPU
	// RemoteSwitch: an NVSwitch (every GPU behind the switch fabric is
	// reachable through it).
	RemoteSwitch
	// RemoteCPU: a CPU's NVLink port (IBM POWER's NPU).
	RemoteCPU
)

// String names the kind: "gpu", "nvswitch", "cpu" or "unknown".
func (k RemoteKind) String() string {
	switch k {
	case RemoteGPU:
		return "gpu"
	case RemoteSwitch:
		return "nvswitch"
	case RemoteCPU:
		return "cpu"
	}
	return "unknown"
}

// Link is one active NVLink of a GPU.
type Link struct {
	// Index is the link's number on its GPU (0 to nvml.NVLINK_MAX_LINKS-1).
	Index int
	// Kind is what is at the far end.
	Kind RemoteKind
	// Remote is the PCI bus id at the far end (the GPU's when Kind is
	// RemoteGPU, the switch's for RemoteSwitch).
	Remote BusID
}

// GPU is one device as NVML sees it.
type GPU struct {
	// Index is NVML's device index (the order of nvidia-smi, which follows
	// PCI bus ids; CUDA's order may differ unless CUDA_DEVICE_ORDER=PCI_BUS_ID).
	Index int
	// Name is the product name, e.g. "Tesla V100-SXM2-32GB".
	Name string
	// UUID is NVML's "GPU-..." identifier.
	UUID string
	// BusID is the GPU's PCI address, the key the communicator matches on.
	BusID BusID
	// Links are the GPU's active NVLinks, in link order.
	Links []Link
	// MIG reports that MIG mode is enabled: the GPU is split into
	// instances, which have no peer access to any other GPU (over NVLink
	// or PCIe), so a set holding it has none.
	MIG bool `json:",omitempty"`
	// DownLinks counts the GPU's NVLinks that exist but are not active (a
	// cable or bridge missing, or a link trained down): a machine with one
	// is classified by the links that work.
	DownLinks int
	// NUMANode is the NUMA node closest to the GPU, -1 where unknown.
	NUMANode int
	// CPUs are the CPUs with affinity to the GPU, ascending; nil where
	// unknown.
	CPUs []int
	// Fabric is where the fabric manager registered the GPU in its NVLink
	// fabric; nil where NVML cannot tell (no fabric, as on PCIe or
	// NVLink-bridge GPUs; a driver without nvmlDeviceGetGpuFabricInfo;
	// registration not complete or failed). Absent from machines saved
	// before it was read.
	Fabric *Fabric `json:",omitempty"`
}

// Fabric is a GPU's place in an NVLink fabric, from
// nvmlDeviceGetGpuFabricInfo once registration completed: GPUs of one
// cluster and clique reach each other over NVLink; GPUs of different ones
// (fabric manager partitions, the cliques of an NVL72 rack) do not, though
// each has NVLinks into the switches.
type Fabric struct {
	// Cluster is the fabric's cluster UUID.
	Cluster string
	// Clique is the GPU's clique within the cluster.
	Clique uint32
}

// SwitchLinks returns how many of the GPU's active NVLinks end at an
// NVSwitch.
func (g *GPU) SwitchLinks() int {
	n := 0
	for _, l := range g.Links {
		if l.Kind == RemoteSwitch {
			n++
		}
	}
	return n
}

// Level is how far apart two GPUs are on PCIe, as in `nvidia-smi topo -m`
// (NVML's nvmlGpuTopologyLevel_t).
type Level int

// PCIe path levels, nearest first.
const (
	// LevelUnknown: NVML could not say.
	LevelUnknown Level = iota
	// LevelBoard: the same board (a dual-GPU card).
	LevelBoard
	// LevelPIX: at most one PCIe switch between them.
	LevelPIX
	// LevelPXB: several PCIe switches, no host bridge.
	LevelPXB
	// LevelPHB: through a PCIe host bridge.
	LevelPHB
	// LevelNode: through host bridges within one NUMA node.
	LevelNode
	// LevelSys: across NUMA nodes (QPI/UPI or SMP interconnect).
	LevelSys
)

// String gives nvidia-smi's abbreviation: "PIX", "PXB", "PHB", "NODE",
// "SYS", "BRD" for the same board, "?" for unknown.
func (l Level) String() string {
	switch l {
	case LevelBoard:
		return "BRD"
	case LevelPIX:
		return "PIX"
	case LevelPXB:
		return "PXB"
	case LevelPHB:
		return "PHB"
	case LevelNode:
		return "NODE"
	case LevelSys:
		return "SYS"
	}
	return "?"
}

// P2P is NVML's peer-to-peer status of one capability between two GPUs
// (nvmlGpuP2PStatus_t), with nvidia-smi's abbreviations.
type P2P int

// Peer-to-peer statuses.
const (
	// P2PUnknown: NVML could not say ("U").
	P2PUnknown P2P = iota
	// P2POK: supported ("OK").
	P2POK
	// P2PChipsetNotSupported: the chipset does not support it ("CNS").
	P2PChipsetNotSupported
	// P2PGPUNotSupported: the GPU does not support it ("GNS").
	P2PGPUNotSupported
	// P2PTopologyNotSupported: the PCIe topology does not ("TNS"), e.g.
	// across CPU sockets.
	P2PTopologyNotSupported
	// P2PDisabledByRegkey: disabled by a driver registry key ("DIS").
	P2PDisabledByRegkey
	// P2PNotSupported: not supported for another reason ("NS").
	P2PNotSupported
)

// String gives nvidia-smi topo -p2p's abbreviation.
func (p P2P) String() string {
	switch p {
	case P2POK:
		return "OK"
	case P2PChipsetNotSupported:
		return "CNS"
	case P2PGPUNotSupported:
		return "GNS"
	case P2PTopologyNotSupported:
		return "TNS"
	case P2PDisabledByRegkey:
		return "DIS"
	case P2PNotSupported:
		return "NS"
	}
	return "U"
}

// Describe says what the status means, for messages.
func (p P2P) Describe() string {
	switch p {
	case P2POK:
		return "supported"
	case P2PChipsetNotSupported:
		return "not supported by the chipset"
	case P2PGPUNotSupported:
		return "not supported by the GPU"
	case P2PTopologyNotSupported:
		return "not supported by the PCIe topology"
	case P2PDisabledByRegkey:
		return "disabled by a driver registry key"
	case P2PNotSupported:
		return "not supported"
	}
	return "unknown"
}

// Pair is the connection from one GPU to another.
type Pair struct {
	// NVLinks is the number of active NVLinks joining the two GPUs directly.
	NVLinks int
	// Read is NVML's P2P status for reading the peer's memory.
	Read P2P
	// NVLinkP2P is NVML's P2P status for peer access over NVLink.
	NVLinkP2P P2P
	// Level is the PCIe path between the two.
	Level Level
}

// Machine is every GPU NVML reports and how each pair is connected. It is
// not changed after Detect, so its methods are safe for concurrent use.
type Machine struct {
	// GPUs in NVML index order.
	GPUs []GPU
	// Pairs[i][j] connects GPUs[i] to GPUs[j]; the diagonal is zero.
	Pairs [][]Pair
	// Driver is the driver version NVML reports ("" where unknown).
	Driver string
	// Unusable are the GPUs NVML lists but cannot read (lost, or a device
	// this process may not open), each as the error; they are left out of
	// GPUs and Pairs.
	Unusable []string `json:",omitempty"`
}

// GPU returns the index in m.GPUs of the GPU at bus id b, or -1.
func (m *Machine) GPU(b BusID) int {
	for i := range m.GPUs {
		if m.GPUs[i].BusID == b {
			return i
		}
	}
	return -1
}

// viaSwitch reports whether GPUs i and j reach each other through the
// NVSwitch fabric: both have links into it, and nothing NVML says keeps
// them apart (switchApart).
func (m *Machine) viaSwitch(i, j int) bool {
	return m.GPUs[i].SwitchLinks() > 0 && m.GPUs[j].SwitchLinks() > 0 && m.switchApart(i, j) == ""
}

// switchApart says why GPUs i and j, though both may have NVLinks into
// NVSwitches, cannot reach each other over them, or "" where nothing says
// so: NVML's NVLink P2P status either way is known and not OK, or both
// GPUs' fabric registrations are complete and name different clusters or
// cliques (a fabric split into partitions, an NVL72 rack's cliques). An
// unknown status or fabric (older drivers, GPUs without the call) keeps
// them together, as before either was read.
func (m *Machine) switchApart(i, j int) string {
	gi, gj := &m.GPUs[i], &m.GPUs[j]
	for _, d := range [][2]int{{i, j}, {j, i}} {
		if p := m.Pairs[d[0]][d[1]].NVLinkP2P; p != P2PUnknown && p != P2POK {
			return fmt.Sprintf("GPU %d (%s) has no NVLink peer access to GPU %d (%s): %s (the NVSwitch fabric is split into partitions)",
				m.GPUs[d[0]].Index, m.GPUs[d[0]].BusID, m.GPUs[d[1]].Index, m.GPUs[d[1]].BusID, p.Describe())
		}
	}
	if fi, fj := gi.Fabric, gj.Fabric; fi != nil && fj != nil && *fi != *fj {
		return fmt.Sprintf("GPU %d (%s) and GPU %d (%s) are in different NVLink fabric partitions (cluster %s clique %d, cluster %s clique %d)",
			gi.Index, gi.BusID, gj.Index, gj.BusID, fi.Cluster, fi.Clique, fj.Cluster, fj.Clique)
	}
	return ""
}
