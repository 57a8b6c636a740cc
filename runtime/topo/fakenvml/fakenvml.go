// Package fakenvml builds fake NVML libraries on go-nvml's generated mocks
// (pkg/nvml/mock, and its mock/dgxa100 server for the NVSwitch machine), so
// topo.Detect, `collgen topo --fake NAME` and their tests run without a GPU.
// Every fake is deterministic: fixed bus ids, UUIDs and affinities.
package fakenvml

import (
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/collgen/collgen/runtime/topo"
)

// Layout describes a fake machine.
type Layout struct {
	// Name is the GPUs' product name.
	Name string
	// BusIDs are the GPUs' PCI bus ids in NVML index order (NVML's long
	// form, "00000000:07:00.0"); their count is the GPU count.
	BusIDs []string
	// NVLinks[i][j] is the number of direct NVLinks between GPUs i and j
	// (symmetric); nil for none. A GPU with no link at all reports NVLink
	// as not supported.
	NVLinks [][]int
	// Down[i] is the number of GPU i's NVLinks that are present but not
	// active (reported after its active ones); nil for none.
	Down []int
	// SwitchLinks is the number of NVLinks from every GPU into the NVSwitch
	// fabric, spread over Switches.
	SwitchLinks int
	// Switches are the NVSwitches' bus ids.
	Switches []string
	// SwitchNoPCI makes nvmlDeviceGetNvLinkRemotePciInfo fail on links to
	// a switch, as it may where the switches are not PCI devices of the
	// host.
	SwitchNoPCI bool
	// P2P(i, j) is the read (and NVLink) P2P status from GPU i to GPU j.
	P2P func(i, j int) nvml.GpuP2PStatus
	// NVLinkP2P(i, j), where set, is the NVLink P2P status from GPU i to
	// GPU j instead of P2P's (a partitioned NVSwitch fabric: reads over
	// PCIe, no NVLink between partitions).
	NVLinkP2P func(i, j int) nvml.GpuP2PStatus
	// Fabric[i] is GPU i's answer to nvmlDeviceGetGpuFabricInfo; nil: the
	// call is not supported (no fabric).
	Fabric []nvml.GpuFabricInfo
	// Level(i, j) is the PCIe path between GPUs i and j.
	Level func(i, j int) nvml.GpuTopologyLevel
	// NUMA is each GPU's NUMA node; nil: the driver cannot tell.
	NUMA []int
	// CPUs lists each GPU's CPU affinity.
	CPUs [][]int
	// MIG[i] enables MIG mode on GPU i; nil for none.
	MIG []bool
	// OldDriver hides nvmlDeviceGetNvLinkRemoteDeviceType,
	// nvmlDeviceGetNumaNodeId and nvmlDeviceGetGpuFabricInfo, as an older
	// libnvidia-ml does.
	OldDriver bool
}

// Names lists the built-in machines New accepts, sorted.
func Names() []string {
	var names []string
	for n := range machines {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// machines are the built-in fake machines.
var machines = map[string]func() nvml.Interface{
	"dgx1":      func() nvml.Interface { return Build(DGX1()) },
	"nvswitch8": NVSwitch8,
	"pcie4":     func() nvml.Interface { return Build(PCIe4()) },
	"bridge2":   func() nvml.Interface { return Build(Bridge2()) },
}

// New returns the built-in fake machine called name: dgx1 (8 x V100 in a
// hybrid cube mesh), nvswitch8 (8 x A100 on NVSwitch, from go-nvml's
// dgxa100 mock), pcie4 (4 GPUs on PCIe without peer access) or bridge2
// (2 GPUs joined by an NVLink bridge).
func New(name string) (nvml.Interface, error) {
	f, ok := machines[name]
	if !ok {
		return nil, fmt.Errorf("fakenvml: unknown fake machine %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return f(), nil
}

// Machine detects the built-in fake machine called name: New, then
// topo.Detect.
func Machine(name string) (*topo.Machine, error) {
	lib, err := New(name)
	if err != nil {
		return nil, err
	}
	return topo.Detect(lib)
}

// dgx1NV is the DGX-1 (V100) NVLink matrix as `nvidia-smi topo -m` shows
// it: quads {0..3} and {4..7}, each fully connected, plus i <-> i+4; six
// links per GPU.
var dgx1NV = [][]int{
	{0, 1, 1, 2, 2, 0, 0, 0},
	{1, 0, 2, 1, 0, 2, 0, 0},
	{1, 2, 0, 2, 0, 0, 1, 0},
	{2, 1, 2, 0, 0, 0, 0, 1},
	{2, 0, 0, 0, 0, 1, 1, 2},
	{0, 2, 0, 0, 1, 0, 2, 1},
	{0, 0, 1, 0, 1, 2, 0, 2},
	{0, 0, 0, 1, 2, 1, 2, 0},
}

// span returns the integers lo..hi.
func span(lo, hi int) []int {
	var v []int
	for i := lo; i <= hi; i++ {
		v = append(v, i)
	}
	return v
}

// socketLevel is the PCIe path of a two-socket box where GPUs 2k and 2k+1
// share a PCIe switch and GPUs 0..half-1 hang off socket 0.
func socketLevel(half int) func(i, j int) nvml.GpuTopologyLevel {
	return func(i, j int) nvml.GpuTopologyLevel {
		switch {
		case i/2 == j/2:
			return nvml.TOPOLOGY_SINGLE
		case i/half == j/half:
			return nvml.TOPOLOGY_NODE
		}
		return nvml.TOPOLOGY_SYSTEM
	}
}

// DGX1 is an NVIDIA DGX-1 with 8 x V100: the hybrid cube mesh. Peer
// access works between NVLinked GPUs only (across the two CPU sockets PCIe
// P2P is not supported).
func DGX1() Layout {
	return Layout{
		Name: "Tesla V100-SXM2-32GB",
		BusIDs: []string{"00000000:06:00.0", "00000000:07:00.0", "00000000:0A:00.0", "00000000:0B:00.0",
			"00000000:85:00.0", "00000000:86:00.0", "00000000:89:00.0", "00000000:8A:00.0"},
		NVLinks: dgx1NV,
		P2P: func(i, j int) nvml.GpuP2PStatus {
			if dgx1NV[i][j] > 0 {
				return nvml.P2P_STATUS_OK
			}
			return nvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
		},
		Level: socketLevel(4),
		NUMA:  []int{0, 0, 0, 0, 1, 1, 1, 1},
		CPUs: [][]int{
			append(span(0, 19), span(40, 59)...), append(span(0, 19), span(40, 59)...),
			append(span(0, 19), span(40, 59)...), append(span(0, 19), span(40, 59)...),
			append(span(20, 39), span(60, 79)...), append(span(20, 39), span(60, 79)...),
			append(span(20, 39), span(60, 79)...), append(span(20, 39), span(60, 79)...),
		},
	}
}

// PCIe4 is a 4-GPU PCIe box whose GPUs cannot access each other (consumer
// GPUs with peer-to-peer disabled).
func PCIe4() Layout {
	return Layout{
		Name:   "NVIDIA GeForce RTX 4090",
		BusIDs: []string{"00000000:01:00.0", "00000000:21:00.0", "00000000:41:00.0", "00000000:61:00.0"},
		P2P:    func(i, j int) nvml.GpuP2PStatus { return nvml.P2P_STATUS_GPU_NOT_SUPPORTED },
		Level:  func(i, j int) nvml.GpuTopologyLevel { return nvml.TOPOLOGY_NODE },
		NUMA:   []int{0, 0, 0, 0},
		CPUs:   [][]int{span(0, 31), span(0, 31), span(0, 31), span(0, 31)},
	}
}

// Bridge2 is a workstation with 2 x RTX A6000 joined by an NVLink bridge
// (4 links).
func Bridge2() Layout {
	return Layout{
		Name:    "NVIDIA RTX A6000",
		BusIDs:  []string{"00000000:17:00.0", "00000000:65:00.0"},
		NVLinks: [][]int{{0, 4}, {4, 0}},
		P2P:     func(i, j int) nvml.GpuP2PStatus { return nvml.P2P_STATUS_OK },
		Level:   func(i, j int) nvml.GpuTopologyLevel { return nvml.TOPOLOGY_HOSTBRIDGE },
		NUMA:    []int{0, 0},
		CPUs:    [][]int{span(0, 23), span(0, 23)},
	}
}

// NVSwitch8Layout is an HGX A100 8-GPU board: 12 NVLinks from every GPU,
// two to each of 6 NVSwitches, peer access everywhere.
func NVSwitch8Layout() Layout {
	return Layout{
		Name: "NVIDIA A100-SXM4-40GB",
		BusIDs: []string{"00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:4E:00.0",
			"00000000:87:00.0", "00000000:90:00.0", "00000000:B7:00.0", "00000000:BD:00.0"},
		SwitchLinks: 12,
		Switches:    []string{"00000000:C1:00.0", "00000000:C2:00.0", "00000000:C3:00.0", "00000000:C4:00.0", "00000000:C5:00.0", "00000000:C6:00.0"},
		P2P:         func(i, j int) nvml.GpuP2PStatus { return nvml.P2P_STATUS_OK },
		Level:       socketLevel(4),
		NUMA:        []int{0, 0, 0, 0, 1, 1, 1, 1},
		CPUs: [][]int{span(0, 63), span(0, 63), span(0, 63), span(0, 63),
			span(64, 127), span(64, 127), span(64, 127), span(64, 127)},
	}
}

// NVSwitch8 is go-nvml's DGX A100 server mock (mock/dgxa100) with the
// NVSwitch8Layout's NVLinks, P2P, PCIe and affinity answers added, and its
// random UUIDs replaced by fixed ones.
func NVSwitch8() nvml.Interface {
	s := dgxa100.New()
	l := NVSwitch8Layout()
	devs := make([]*mock.Device, len(s.Devices))
	for i, d := range s.Devices {
		dd := d.(*dgxa100.Device)
		dd.UUID = fixedUUID(i)
		devs[i] = &dd.Device
	}
	configure(l, devs, s.Devices[:])
	return s
}

// fixedUUID is a deterministic UUID for fake GPU i.
func fixedUUID(i int) string {
	return fmt.Sprintf("GPU-00000000-0000-4000-8000-%012x", i)
}

// Build returns a fake NVML library for a layout, on go-nvml's
// mock.Interface and mock.Device.
func Build(l Layout) nvml.Interface {
	n := len(l.BusIDs)
	devs := make([]*mock.Device, n)
	handles := make([]nvml.Device, n)
	for i := range devs {
		devs[i] = &mock.Device{}
		handles[i] = devs[i]
		uuid, name := fixedUUID(i), l.Name
		devs[i].GetUUIDFunc = func() (string, nvml.Return) { return uuid, nvml.SUCCESS }
		devs[i].GetNameFunc = func() (string, nvml.Return) { return name, nvml.SUCCESS }
	}
	configure(l, devs, handles)
	missing := map[string]bool{}
	if l.OldDriver {
		missing["nvmlDeviceGetNvLinkRemoteDeviceType"] = true
		missing["nvmlDeviceGetNumaNodeId"] = true
		missing["nvmlDeviceGetGpuFabricInfo"] = true
	}
	ext := &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error {
		if missing[s] {
			return fmt.Errorf("undefined symbol: %s", s)
		}
		return nil
	}}
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "550.54.15", nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return n, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= n {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return handles[i], nvml.SUCCESS
		},
		ExtensionsFunc: func() nvml.ExtendedInterface { return ext },
	}
}

// pciInfo is what NVML returns for a bus id in its long form.
func pciInfo(busID string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := 0; i < len(busID) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(busID[i])
	}
	var dom, bus, dev, fn uint32
	if _, err := fmt.Sscanf(busID, "%x:%x:%x.%x", &dom, &bus, &dev, &fn); err != nil {
		panic(fmt.Sprintf("fakenvml: bad bus id %q in a layout: %v", busID, err))
	}
	p.Domain, p.Bus, p.Device = dom, bus, dev
	return p
}

// link is one NVLink end as the fake reports it.
type link struct {
	remote string
	kind   nvml.IntNvLinkDeviceType
}

// configure sets the topology answers of a layout on mock devices; handles
// are the nvml.Device values callers pass back (for P2P and common
// ancestor queries), devs the mocks to configure.
func configure(l Layout, devs []*mock.Device, handles []nvml.Device) {
	index := map[nvml.Device]int{}
	for i, h := range handles {
		index[h] = i
	}
	for i, d := range devs {
		var links []link
		for j := range devs {
			if l.NVLinks == nil {
				break
			}
			for k := 0; k < l.NVLinks[i][j]; k++ {
				links = append(links, link{remote: l.BusIDs[j], kind: nvml.NVLINK_DEVICE_TYPE_GPU})
			}
		}
		for k := 0; k < l.SwitchLinks; k++ {
			links = append(links, link{remote: l.Switches[k%len(l.Switches)], kind: nvml.NVLINK_DEVICE_TYPE_SWITCH})
		}
		d.GetIndexFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo(l.BusIDs[i]), nvml.SUCCESS }
		down := 0
		if l.Down != nil {
			down = l.Down[i]
		}
		d.GetNvLinkStateFunc = func(n int) (nvml.EnableState, nvml.Return) {
			switch {
			case len(links)+down == 0:
				return 0, nvml.ERROR_NOT_SUPPORTED
			case n < 0 || n >= len(links)+down:
				return 0, nvml.ERROR_INVALID_ARGUMENT
			case n >= len(links):
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(n int) (nvml.PciInfo, nvml.Return) {
			switch {
			case n < 0 || n >= len(links):
				return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
			case l.SwitchNoPCI && links[n].kind == nvml.NVLINK_DEVICE_TYPE_SWITCH:
				return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return pciInfo(links[n].remote), nvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(n int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			if l.OldDriver {
				panic("fakenvml: nvmlDeviceGetNvLinkRemoteDeviceType called though LookupSymbol said it is missing")
			}
			if n < 0 || n >= len(links) {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return links[n].kind, nvml.SUCCESS
		}
		d.GetP2PStatusFunc = func(peer nvml.Device, c nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			j, ok := index[peer]
			if !ok {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if c == nvml.P2P_CAPS_INDEX_NVLINK && l.NVLinkP2P != nil {
				return l.NVLinkP2P(i, j), nvml.SUCCESS
			}
			return l.P2P(i, j), nvml.SUCCESS
		}
		d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
			if l.OldDriver {
				panic("fakenvml: nvmlDeviceGetGpuFabricInfo called though LookupSymbol said it is missing")
			}
			if l.Fabric == nil {
				return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return l.Fabric[i], nvml.SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(peer nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			j, ok := index[peer]
			if !ok {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return l.Level(i, j), nvml.SUCCESS
		}
		if d.GetMigModeFunc == nil || l.MIG != nil { // dgxa100's devices answer with their SetMigMode
			mig := nvml.DEVICE_MIG_DISABLE
			if l.MIG != nil && l.MIG[i] {
				mig = nvml.DEVICE_MIG_ENABLE
			}
			d.GetMigModeFunc = func() (int, int, nvml.Return) { return mig, mig, nvml.SUCCESS }
		}
		d.GetNumaNodeIdFunc = func() (int, nvml.Return) {
			if l.OldDriver {
				panic("fakenvml: nvmlDeviceGetNumaNodeId called though LookupSymbol said it is missing")
			}
			if l.NUMA == nil {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return l.NUMA[i], nvml.SUCCESS
		}
		d.GetCpuAffinityFunc = func(n int) ([]uint, nvml.Return) {
			mask := make([]uint, (n-1)/8+1) // go-nvml's sizing: n/8 words of 64 bits
			if l.CPUs == nil {
				return nil, nvml.ERROR_NOT_SUPPORTED
			}
			for _, c := range l.CPUs[i] {
				mask[c/64] |= 1 << (c % 64)
			}
			return mask, nvml.SUCCESS
		}
	}
}
