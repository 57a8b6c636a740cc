//go:build cgo

package comm

import (
	"fmt"
	"sync"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/topo"
)

func (d *cudaDevice) busID() (string, error) {
	if d.handle.PCIBusID == "" {
		return "", fmt.Errorf("GPU %d: cuDeviceGetPCIBusId gave no bus id", d.cfg.Device)
	}
	return d.handle.PCIBusID, nil
}

// nvmlMu serialises NVML detection between goroutine ranks of one process:
// go-nvml's library loading sets package-level symbol tables.
var nvmlMu sync.Mutex

func (d *cudaDevice) classify(ids []string) (classification, error) {
	nvmlMu.Lock()
	m, err := topo.Open()
	nvmlMu.Unlock()
	if err != nil {
		return classification{}, err
	}
	return classifyOn(m, ids)
}

// classifyOn classifies the GPUs at ids on machine m (also the fakes' path).
func classifyOn(m *topo.Machine, ids []string) (classification, error) {
	bus, err := topo.ParseBusIDs(ids)
	if err != nil {
		return classification{}, err
	}
	c, err := m.Classify(bus...)
	if err != nil {
		return classification{}, err
	}
	spec, _ := c.Kind.SpecKind()
	return classification{Kind: string(c.Kind), Spec: spec, Corners: c.Corners, Reason: c.Reason}, nil
}

func (d *cudaDevice) canAccessPeers(ids []string) ([]int, error) {
	out := make([]int, len(ids))
	for p, id := range ids {
		ok, err := d.handle.CanAccessPeerBusID(id)
		switch {
		case cuda.IsCode(err, cuda.ErrorInvalidDevice) || cuda.IsCode(err, cuda.ErrorInvalidValue):
			out[p] = peerUnknown // hidden from this process (CUDA_VISIBLE_DEVICES)
		case err != nil:
			return nil, err
		case ok:
			out[p] = peerYes
		default:
			out[p] = peerNo
		}
	}
	return out, nil
}
