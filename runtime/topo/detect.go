package topo

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Library is the part of go-nvml's nvml.Interface that Detect uses. Both
// nvml.New() and go-nvml's generated mock (mock.Interface, and servers built
// on it such as mock/dgxa100) satisfy it.
type Library interface {
	Init() nvml.Return                                     // nvmlInit; Detect pairs it with Shutdown
	Shutdown() nvml.Return                                 // nvmlShutdown
	SystemGetDriverVersion() (string, nvml.Return)         // the driver version, for the report
	DeviceGetCount() (int, nvml.Return)                    // GPUs NVML sees (all of them, not CUDA_VISIBLE_DEVICES)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return) // the GPU of NVML index i (not a CUDA ordinal)
	Extensions() nvml.ExtendedInterface                    // LookupSymbol, to tell a library lacking a call from a failing one
}

// LibraryName is the shared library go-nvml dlopens.
const LibraryName = "libnvidia-ml.so.1"

// ErrNoNVML is wrapped by the error of a machine where NVML cannot be used:
// no libnvidia-ml, no NVIDIA kernel driver, no permission, or NVML
// unsupported. Callers then fall back to probing peer access through CUDA.
var ErrNoNVML = errors.New("NVML is not available")

// ErrUnknownGPU is wrapped by Classify's error for a bus id that is not a
// GPU of the machine.
var ErrUnknownGPU = errors.New("no such GPU")

// NVMLError is an NVML call that failed.
type NVMLError struct {
	// Op is the NVML function, e.g. "nvmlInit" or "nvmlDeviceGetPciInfo".
	Op string
	// GPU is the device index the call was about, -1 for none.
	GPU int
	// Return is NVML's status.
	Return nvml.Return
}

// unavailable reports whether an NVML status means NVML as a whole cannot
// be used on this machine (rather than one call failing).
func (e *NVMLError) unavailable() bool {
	switch e.Return {
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		return true
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NO_PERMISSION, nvml.ERROR_FUNCTION_NOT_FOUND:
		return e.Op == "nvmlInit"
	}
	return false
}

// Error says what failed and, where NVML is unavailable, what to do.
func (e *NVMLError) Error() string {
	what := e.Op
	if e.GPU >= 0 {
		what = fmt.Sprintf("%s(GPU %d)", e.Op, e.GPU)
	}
	msg := fmt.Sprintf("topo: %s: %v", what, e.Return)
	switch {
	case e.Return == nvml.ERROR_LIBRARY_NOT_FOUND:
		return msg + "; " + LibraryName + " was not found: install the NVIDIA driver (it ships " + LibraryName +
			") or add its directory to LD_LIBRARY_PATH; without NVML, the communicator probes peer access through CUDA instead"
	case e.Return == nvml.ERROR_DRIVER_NOT_LOADED:
		return msg + "; the NVIDIA kernel driver is not loaded: load it (modprobe nvidia) or run where NVIDIA GPUs are; " +
			"without NVML, the communicator probes peer access through CUDA instead"
	case e.Return == nvml.ERROR_NO_PERMISSION && e.unavailable():
		return msg + "; this user may not open the NVIDIA devices (/dev/nvidia*): fix their permissions or the container's device list"
	case e.unavailable():
		return msg + "; NVML is not supported here (" + LibraryName + " too old, or a virtual GPU without it): " +
			"the communicator probes peer access through CUDA instead"
	}
	return msg
}

// Unwrap returns ErrNoNVML where NVML as a whole is unavailable.
func (e *NVMLError) Unwrap() error {
	if e.unavailable() {
		return ErrNoNVML
	}
	return nil
}

// Open loads libnvidia-ml with go-nvml and detects the machine. Without the
// library or the driver, the error wraps ErrNoNVML.
func Open() (*Machine, error) {
	return Detect(nvml.New())
}

// notAvailable reports whether an optional query's status means "this GPU
// or driver cannot tell" rather than a failure.
func notAvailable(r nvml.Return) bool {
	switch r {
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_INVALID_ARGUMENT,
		nvml.ERROR_NOT_FOUND, nvml.ERROR_NO_PERMISSION:
		return true
	}
	return false
}

// Detect initialises NVML through lib, reads every GPU, its NVLinks, its
// NVLink fabric clique, the P2P status and PCIe path of every pair and
// each GPU's NUMA/CPU affinity, and shuts NVML down again. Queries a GPU or driver does not support are
// left at their zero values ("unknown"); symbols an older libnvidia-ml lacks
// are looked up before use (go-nvml calls them without a check).
func Detect(lib Library) (*Machine, error) {
	if r := lib.Init(); r != nvml.SUCCESS {
		return nil, &NVMLError{Op: "nvmlInit", GPU: -1, Return: r}
	}
	defer lib.Shutdown()
	has := func(symbol string) bool {
		ext := lib.Extensions()
		return ext != nil && ext.LookupSymbol(symbol) == nil
	}
	hasRemoteType := has("nvmlDeviceGetNvLinkRemoteDeviceType")
	hasNUMA := has("nvmlDeviceGetNumaNodeId")
	hasMIG := has("nvmlDeviceGetMigMode")
	hasFabric := has("nvmlDeviceGetGpuFabricInfo")

	m := &Machine{}
	if v, r := lib.SystemGetDriverVersion(); r == nvml.SUCCESS {
		m.Driver = v
	}
	n, r := lib.DeviceGetCount()
	if r != nvml.SUCCESS {
		return nil, &NVMLError{Op: "nvmlDeviceGetCount", GPU: -1, Return: r}
	}
	// A GPU that NVML lists but cannot read (lost, or not this process's
	// to open) is left out and named, as nvidia-smi does: the others are
	// still usable.
	var devs []nvml.Device
	for i := 0; i < n; i++ {
		d, r := lib.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			m.Unusable = append(m.Unusable, (&NVMLError{Op: "nvmlDeviceGetHandleByIndex", GPU: i, Return: r}).Error())
			continue
		}
		g, err := readGPU(d, i, hasRemoteType, hasNUMA, hasMIG)
		if err == nil && hasFabric {
			g.Fabric = readFabric(d)
		}
		var ne *NVMLError
		if errors.As(err, &ne) {
			m.Unusable = append(m.Unusable, err.Error())
			continue
		}
		if err != nil {
			return nil, err
		}
		devs = append(devs, d)
		m.GPUs = append(m.GPUs, g)
	}
	n = len(devs)
	// Without the remote device type, a link whose far end is no GPU of
	// this machine ends at a switch (an NVSwitch has its own bus id).
	for i := range m.GPUs {
		for k := range m.GPUs[i].Links {
			l := &m.GPUs[i].Links[k]
			if l.Kind != RemoteUnknown {
				continue
			}
			if m.GPU(l.Remote) >= 0 {
				l.Kind = RemoteGPU
			} else {
				l.Kind = RemoteSwitch
			}
		}
	}
	m.Pairs = make([][]Pair, n)
	for i := range m.Pairs {
		m.Pairs[i] = make([]Pair, n)
		for j := range m.Pairs[i] {
			if i == j {
				continue
			}
			p := &m.Pairs[i][j]
			for _, l := range m.GPUs[i].Links {
				if l.Kind == RemoteGPU && l.Remote == m.GPUs[j].BusID {
					p.NVLinks++
				}
			}
			p.Read = p2pStatus(devs[i], devs[j], nvml.P2P_CAPS_INDEX_READ)
			p.NVLinkP2P = p2pStatus(devs[i], devs[j], nvml.P2P_CAPS_INDEX_NVLINK)
			if lv, r := devs[i].GetTopologyCommonAncestor(devs[j]); r == nvml.SUCCESS {
				p.Level = level(lv)
			}
		}
	}
	return m, nil
}

// readGPU reads one device's identity, NVLinks and affinity.
func readGPU(d nvml.Device, i int, hasRemoteType, hasNUMA, hasMIG bool) (GPU, error) {
	g := GPU{Index: i, NUMANode: -1}
	if idx, r := d.GetIndex(); r == nvml.SUCCESS {
		g.Index = idx
	}
	var r nvml.Return
	if g.Name, r = d.GetName(); r != nvml.SUCCESS && !notAvailable(r) {
		return g, &NVMLError{Op: "nvmlDeviceGetName", GPU: i, Return: r}
	}
	if g.UUID, r = d.GetUUID(); r != nvml.SUCCESS && !notAvailable(r) {
		return g, &NVMLError{Op: "nvmlDeviceGetUUID", GPU: i, Return: r}
	}
	pci, r := d.GetPciInfo()
	if r != nvml.SUCCESS {
		return g, &NVMLError{Op: "nvmlDeviceGetPciInfo", GPU: i, Return: r}
	}
	b, err := pciBusID(pci)
	if err != nil {
		return g, fmt.Errorf("topo: GPU %d: %w", i, err)
	}
	g.BusID = b
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		st, r := d.GetNvLinkState(l)
		if r == nvml.ERROR_NOT_SUPPORTED && l == 0 {
			break // no NVLink on this GPU
		}
		if r != nvml.SUCCESS {
			continue // past the GPU's last link
		}
		if st != nvml.FEATURE_ENABLED {
			g.DownLinks++
			continue
		}
		link := Link{Index: l}
		// A GPU's far end always reports its bus id; a switch port may
		// not, or may report one that is no bus id (H100/H200 NVSwitch
		// systems answer "FFFFFFFF:FF:FF.0"). Then Remote stays zero and
		// the link counts as a switch link unless NVML says otherwise; a
		// GPU link must name its peer, so an unreadable id there is an
		// error.
		if rp, r := d.GetNvLinkRemotePciInfo(l); r == nvml.SUCCESS {
			remote, perr := pciBusID(rp)
			if perr == nil {
				link.Remote = remote
			} else if !allOnes(rp) {
				return g, fmt.Errorf("topo: GPU %d NVLink %d: %w", i, l, perr)
			}
		}
		if hasRemoteType {
			if t, r := d.GetNvLinkRemoteDeviceType(l); r == nvml.SUCCESS {
				switch t {
				case nvml.NVLINK_DEVICE_TYPE_GPU:
					link.Kind = RemoteGPU
				case nvml.NVLINK_DEVICE_TYPE_SWITCH:
					link.Kind = RemoteSwitch
				case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
					link.Kind = RemoteCPU
				}
			}
		}
		g.Links = append(g.Links, link)
	}
	if hasMIG {
		if cur, _, r := d.GetMigMode(); r == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
			g.MIG = true
		}
	}
	if hasNUMA {
		if node, r := d.GetNumaNodeId(); r == nvml.SUCCESS {
			g.NUMANode = node
		}
	}
	// 1024 asks go-nvml for a mask of 1024/8 64-bit words: 8192 CPUs.
	if mask, r := d.GetCpuAffinity(1024); r == nvml.SUCCESS {
		for w, word := range mask {
			for word != 0 {
				b := bits.TrailingZeros64(uint64(word))
				g.CPUs = append(g.CPUs, w*64+b)
				word &^= 1 << b
			}
		}
	}
	return g, nil
}

// readFabric reads where the fabric manager registered the GPU, or nil
// where NVML cannot tell: the call unsupported (no fabric, or a driver
// that lacks it), registration not complete, or failed.
func readFabric(d nvml.Device) *Fabric {
	fi, r := d.GetGpuFabricInfo()
	if r != nvml.SUCCESS || fi.State != nvml.GPU_FABRIC_STATE_COMPLETED || nvml.Return(fi.Status) != nvml.SUCCESS {
		return nil
	}
	u := fi.ClusterUuid
	return &Fabric{Cluster: fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), Clique: fi.CliqueId}
}

// pciBusID takes the bus id string NVML fills in, or else its numeric
// fields.
func pciBusID(p nvml.PciInfo) (BusID, error) {
	s := busIDString(p)
	if s == "" {
		if p.Bus > 0xff || p.Device > 0x1f {
			return BusID{}, fmt.Errorf("NVML gave no PCI bus id and bad bus %#x device %#x", p.Bus, p.Device)
		}
		return BusID{Domain: p.Domain, Bus: uint8(p.Bus), Device: uint8(p.Device)}, nil
	}
	return ParseBusID(s)
}

// busIDString is the NUL-terminated bus id string NVML fills in, or "".
func busIDString(p nvml.PciInfo) string {
	var s []byte
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// allOnes reports whether p is the all-ones bus id NVML gives for a port
// that has none ("FFFFFFFF:FF:FF.0", or domain and bus all ones).
func allOnes(p nvml.PciInfo) bool {
	if s := busIDString(p); s != "" {
		return strings.HasPrefix(strings.ToUpper(s), "FFFFFFFF:FF:")
	}
	return p.Domain == 0xffffffff && p.Bus == 0xff
}

// p2pStatus asks NVML for one P2P capability from a to b.
func p2pStatus(a, b nvml.Device, c nvml.GpuP2PCapsIndex) P2P {
	st, r := a.GetP2PStatus(b, c)
	if r != nvml.SUCCESS {
		return P2PUnknown
	}
	switch st {
	case nvml.P2P_STATUS_OK:
		return P2POK
	case nvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED:
		return P2PChipsetNotSupported
	case nvml.P2P_STATUS_GPU_NOT_SUPPORTED:
		return P2PGPUNotSupported
	case nvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED:
		return P2PTopologyNotSupported
	case nvml.P2P_STATUS_DISABLED_BY_REGKEY:
		return P2PDisabledByRegkey
	case nvml.P2P_STATUS_NOT_SUPPORTED:
		return P2PNotSupported
	}
	return P2PUnknown
}

// level converts NVML's topology level.
func level(l nvml.GpuTopologyLevel) Level {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return LevelBoard
	case nvml.TOPOLOGY_SINGLE:
		return LevelPIX
	case nvml.TOPOLOGY_MULTIPLE:
		return LevelPXB
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return LevelPHB
	case nvml.TOPOLOGY_NODE:
		return LevelNode
	case nvml.TOPOLOGY_SYSTEM:
		return LevelSys
	}
	return LevelUnknown
}
