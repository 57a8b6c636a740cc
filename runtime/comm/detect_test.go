//go:build cgo

// Topology detection on fake NVML machines (runtime/topo/fakenvml). cgo
// only: runtime/topo reads NVML through go-nvml, which needs cgo.

package comm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/topo"
	"github.com/collgen/collgen/runtime/topo/fakenvml"
	"github.com/collgen/collgen/schedule"
)

// fakeMachine detects one of fakenvml's machines.
func fakeMachine(t *testing.T, name string) *topo.Machine {
	t.Helper()
	m, err := fakenvml.Machine(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// savedMachine reads a machine saved with `collgen topo --json`.
func savedMachine(t *testing.T, file string) *topo.Machine {
	t.Helper()
	f, err := os.Open("../topo/testdata/machines/" + file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := topo.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// machineDevs returns one fake device per rank, rank r on m's GPU gpus[r]:
// NVML classifies on m, and a probe (for ranks without NVML) answers from
// m's peer-read matrix.
func machineDevs(m *topo.Machine, gpus []int) []*fakeDevice {
	devs := make([]*fakeDevice, len(gpus))
	for r, i := range gpus {
		devs[r] = &fakeDevice{rank: r, bus: m.GPUs[i].BusID.String(),
			classifyFn: func(ids []string) (classification, error) { return classifyOn(m, ids) },
			peersFn: func(ids []string) ([]int, error) {
				out := make([]int, len(ids))
				for p, j := range gpus {
					out[p] = peerNo
					if p == r || m.Pairs[i][j].Read == topo.P2POK {
						out[p] = peerYes
					}
				}
				return out, nil
			}}
	}
	return devs
}

// noNVML makes d answer like a machine without libnvidia-ml.
func noNVML(d *fakeDevice) {
	d.classifyFn = func([]string) (classification, error) {
		_, err := topo.Detect(&mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }})
		return classification{}, err
	}
}

// agreed checks that every rank formed and reports the same detection, and
// returns rank 0's.
func agreed(t *testing.T, comms []*Communicator, errs []error) Detected {
	t.Helper()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	d := comms[0].Detected()
	for r, c := range comms {
		if got := c.Detected(); !reflect.DeepEqual(got, d) {
			t.Fatalf("rank %d detected %+v, rank 0 %+v", r, got, d)
		}
	}
	return d
}

// The communicator picks the spec topology of the kind its GPUs are.
func TestDetectFakeMachines(t *testing.T) {
	for _, tc := range []struct {
		name     string
		machine  *topo.Machine
		gpus     []int
		kind     string
		topology string
	}{
		{"dgx1", fakeMachine(t, "dgx1"), identity(8), "hybrid_cube_mesh", "hcm8"},
		{"dgx1 quad", fakeMachine(t, "dgx1"), []int{4, 5, 6, 7}, "nvlink_mesh", "nvswitch"},
		{"dgx1 across quads", fakeMachine(t, "dgx1"), []int{0, 5}, "none", ""},
		{"nvswitch8", fakeMachine(t, "nvswitch8"), identity(8), "nvswitch", "nvswitch"},
		{"nvswitch8 subset", fakeMachine(t, "nvswitch8"), []int{6, 1, 3}, "nvswitch", "nvswitch"},
		{"pcie4", fakeMachine(t, "pcie4"), identity(4), "none", ""},
		{"bridge2", fakeMachine(t, "bridge2"), identity(2), "nvlink_mesh", "nvswitch"},
		{"nvidia-h200-x2", savedMachine(t, "nvidia-h200-x2.nvswitch.json"), identity(2), "nvswitch", "nvswitch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, errs := newFakeComms(t, Config{}, machineDevs(tc.machine, tc.gpus))
			d := agreed(t, comms, errs)
			defer closeAll(t, comms)
			if d.Kind != tc.kind || d.Topology != tc.topology || d.NoNVML != "" {
				t.Errorf("detected %+v, want kind %s, topology %q", d, tc.kind, tc.topology)
			}
			for r, i := range tc.gpus {
				if d.BusIDs[r] != tc.machine.GPUs[i].BusID.String() {
					t.Errorf("rank %d's bus id %s, want %s", r, d.BusIDs[r], tc.machine.GPUs[i].BusID)
				}
			}
		})
	}
}

// withoutTopology is the shipped library less the named topology's rules.
func withoutTopology(name string) *kernels.Library {
	lib := collectives.Library
	var sels []kernels.Selection
	for _, s := range lib.Selections {
		if s.Topology != name {
			sels = append(sels, s)
		}
	}
	return shippedWith(nil, sels)
}

// On NVLink, a library without an nvlink_full topology at the world size
// runs its pcie_p2p kernels (they read every pair, which NVLink serves) and
// says so; at a world size without pcie_p2p either it stays NCCL only
// (""), and with both the nvlink_full one runs.
func TestDetectNVLinkFallsBackToPCIe(t *testing.T) {
	lib := withoutTopology("nvswitch")
	for _, tc := range []struct {
		name     string
		lib      *kernels.Library
		machine  string
		gpus     []int
		topology string
		reason   string
	}{
		{"nvswitch w2", lib, "nvswitch8", identity(2), "pcie", "no nvlink_full topology at this world size, so pcie's pcie_p2p kernels run over NVLink"},
		{"nvlink mesh w2", lib, "bridge2", identity(2), "pcie", "pcie's pcie_p2p kernels run over NVLink"},
		{"nvswitch w8, hcm only", lib, "nvswitch8", identity(8), "", "no nvlink_full topology at this world size (have [hcm8])"},
		{"nvswitch w2, both", collectives.Library, "nvswitch8", identity(2), "nvswitch", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, errs := newFakeComms(t, Config{Library: tc.lib, Topology: ""}, machineDevs(fakeMachine(t, tc.machine), tc.gpus))
			d := agreed(t, comms, errs)
			defer closeAll(t, comms)
			if d.Topology != tc.topology || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("detected %+v, want topology %q, reason containing %q", d, tc.topology, tc.reason)
			}
		})
	}
}

// A Config.Topology is honoured where its kernels run on the detected GPUs
// (pcie kernels on NVSwitch: every pair has peer access), and refused on
// every rank where they cannot (nvlink_full kernels read every pair, which
// a DGX-1 cannot).
func TestDetectExplicitTopology(t *testing.T) {
	comms, errs := newFakeComms(t, Config{Topology: "pcie"}, machineDevs(fakeMachine(t, "nvswitch8"), identity(4)))
	if d := agreed(t, comms, errs); d.Topology != "pcie" || d.Kind != "nvswitch" {
		t.Errorf("pcie on nvswitch8: %+v", d)
	}
	closeAll(t, comms)
	devs := machineDevs(fakeMachine(t, "dgx1"), identity(8))
	_, errs = newFakeComms(t, Config{Topology: "nvswitch"}, devs)
	for r, err := range errs {
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), `Config.Topology "nvswitch" (nvlink_full) cannot run on these GPUs, detected as hybrid_cube_mesh`) {
			t.Errorf("nvswitch on dgx1: rank %d: %v", r, err)
		}
		if !devs[r].released {
			t.Errorf("rank %d's device not released", r)
		}
	}
}

// On a hybrid cube mesh the ranks play the cube's corners: the identity in
// NVML order, another map in a scrambled order, and then every kernel sees
// the corner as its rank and its peer tables in corner order, so every
// read the hcm schedule makes is over an NVLink.
func TestDetectCubeCorners(t *testing.T) {
	diagnoseFor(t, 50*time.Millisecond) // rank 3 is not waiting
	m := fakeMachine(t, "dgx1")
	cube, err := schedule.NewTopology(coll.HybridCubeMesh, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, gpus := range [][]int{identity(8), {0, 4, 1, 5, 2, 6, 3, 7}, {7, 6, 5, 4, 3, 2, 1, 0}} {
		devs := machineDevs(m, gpus)
		comms, errs := newFakeComms(t, Config{}, devs)
		d := agreed(t, comms, errs)
		if d.Topology != "hcm8" || len(d.Corners) != 8 {
			t.Fatalf("GPUs %v: %+v", gpus, d)
		}
		gpuAt := make([]int, 8) // corner -> GPU
		for r, c := range d.Corners {
			gpuAt[c] = gpus[r]
		}
		for a := range 8 {
			for b := range 8 {
				if a != b && cube.Linked(a, b) && m.Pairs[gpuAt[a]][gpuAt[b]].NVLinks == 0 {
					t.Errorf("GPUs %v: corners %d and %d are linked in the schedule, but GPUs %d and %d have no NVLink", gpus, a, b, gpuAt[a], gpuAt[b])
				}
			}
		}
		if slices.Equal(gpus, identity(8)) && !slices.Equal(d.Corners, identity(8)) {
			t.Errorf("NVML order: corners %v, want the identity", d.Corners)
		}
		errs = onRanks(comms, func(r int, c *Communicator) error {
			return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 1<<14, coll.BF16, coll.Sum, Options{})
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		for r, dev := range devs {
			if len(dev.launches) != 1 || dev.launches[0].kernel.Name != "allreduce_hcm_bf16_sum_w8" {
				t.Fatalf("GPUs %v, rank %d: launches %v", gpus, r, dev.launches)
			}
			var a collectives.ArgsW8
			if err := binary.Read(bytes.NewReader(dev.launches[0].args), binary.LittleEndian, &a); err != nil {
				t.Fatal(err)
			}
			if a.Rank != int32(d.Corners[r]) {
				t.Errorf("GPUs %v: rank %d launched as kernel rank %d, want corner %d", gpus, r, a.Rank, d.Corners[r])
			}
			g := comms[r].gpu
			for p := range 8 {
				want := uint64(fakeRegion(p) + cuda.DevicePtr(2*g.slotBytes+g.scratchBytes))
				if a.Signal[d.Corners[p]] != want {
					t.Errorf("GPUs %v: rank %d's signal table at corner %d is %#x, want rank %d's %#x", gpus, r, d.Corners[p], a.Signal[d.Corners[p]], p, want)
				}
			}
		}
		// Zero-copy: the stage table points into each rank's symmetric
		// input, at the rank's corner.
		syms := make([]cuda.DevicePtr, 8)
		errs = onRanks(comms, func(r int, c *Communicator) (err error) {
			if syms[r], err = c.Alloc(context.Background(), 1<<20); err != nil {
				return err
			}
			return c.AllReduce(DeviceBuffer(syms[r]+4096), DeviceBuffer(0x9000), 1<<14, coll.BF16, coll.Sum, Options{})
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		for r, dev := range devs {
			l := dev.launches[1]
			var a collectives.ArgsW8
			if err := binary.Read(bytes.NewReader(l.args), binary.LittleEndian, &a); err != nil {
				t.Fatal(err)
			}
			m, ok := comms[r].gpu.inPlace[l.kernel]
			if !ok || a.SlotBytes != 0 {
				t.Fatalf("GPUs %v, rank %d: %s did not read its input in place", gpus, r, l.kernel.Name)
			}
			chunk := chunkElems(&call{collective: coll.AllReduce, n: 1 << 14, esize: 2}, 8, l.kernel)
			for p := range 8 {
				k := d.Corners[p]
				want := uint64(syms[p]) + 4096 - uint64(2*min(int64(m.delta[k])*chunk, 1<<14))
				if a.Stage[k] != want {
					t.Errorf("GPUs %v: rank %d's zero-copy stage at corner %d is %#x, want rank %d's input %#x", gpus, r, k, a.Stage[k], p, want)
				}
			}
		}
		// Reduce-scatter places data by rank: its kernels may not run
		// with ranks playing other corners.
		err = comms[0].ReduceScatter(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 64, coll.BF16, coll.Sum, Options{Algorithm: coll.OneShot})
		remapped := !slices.Equal(d.Corners, identity(8))
		if remapped != (errors.Is(err, ErrUnsupported) && strings.Contains(err.Error(), "corners")) {
			t.Errorf("GPUs %v (remapped %v): reduce-scatter oneshot: %v", gpus, remapped, err)
		}
		// A kernel's timeout reports corners; the error names ranks.
		devs[0].statusVal = timeoutWord(d.Corners[0], d.Corners[3])
		var te *TimeoutError
		if err := comms[0].Err(); !errors.As(err, &te) || te.Rank != 0 || te.Peer != 3 {
			t.Errorf("GPUs %v: rank 0 (corner %d) timed out waiting for rank 3 (corner %d): %v", gpus, d.Corners[0], d.Corners[3], err)
		}
		closeAll(t, comms)
	}
}

// Without peer access every rank takes the NCCL path: no region is set
// up, automatic selection gives NCCL, kernels and Alloc are refused with
// the reason, and a Config.Topology that needs peer access fails on
// every rank at once.
func TestDetectNoPeerAccess(t *testing.T) {
	m := fakeMachine(t, "pcie4")
	devs := machineDevs(m, identity(4))
	comms, errs := newFakeComms(t, Config{}, devs)
	d := agreed(t, comms, errs)
	if d.Topology != "" || !strings.Contains(d.Reason, "cannot read") || !strings.Contains(d.Reason, "every collective uses NCCL") {
		t.Fatalf("%+v", d)
	}
	errs = onRanks(comms, func(r int, c *Communicator) error {
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 1024, coll.BF16, coll.Sum, Options{})
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r, dev := range devs {
		if dev.setups != 0 || len(dev.preloaded) != 0 || len(dev.launches) != 0 || len(dev.nccl) != 1 {
			t.Errorf("rank %d: %d region set-ups, %d kernels preloaded, %d launches, NCCL calls %v; want NCCL only", r, dev.setups, len(dev.preloaded), len(dev.launches), dev.nccl)
		}
	}
	if err := comms[0].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), 1024, coll.BF16, coll.Sum, Options{Algorithm: coll.OneShot}); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "cannot read") {
		t.Errorf("explicit oneshot: %v", err)
	}
	if _, err := comms[0].Alloc(context.Background(), 1<<20); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Alloc: %v", err)
	}
	closeAll(t, comms)

	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Topology: "pcie"}, `Config.Topology "pcie" (pcie_p2p) cannot run on these GPUs, detected as none`},
		{Config{DisableNCCL: true}, "no generated kernel runs here (none: "},
	} {
		devs := machineDevs(m, identity(4))
		start := time.Now()
		_, errs := newFakeComms(t, tc.cfg, devs)
		for r, err := range errs {
			if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v: rank %d: %v, want ErrUnsupported %q", tc.cfg, r, err, tc.want)
			}
			if !devs[r].released {
				t.Errorf("%+v: rank %d's device not released", tc.cfg, r)
			}
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("%+v: failing took %v", tc.cfg, el)
		}
	}
}

// A rank that cannot use NVML probes peer access instead, and its vote
// counts: one rank without access to a peer sends every rank to NCCL.
func TestDetectVote(t *testing.T) {
	m := fakeMachine(t, "bridge2")

	// Rank 1 has no NVML and no access to rank 0: NCCL for all.
	devs := machineDevs(m, identity(2))
	noNVML(devs[1])
	devs[1].peersFn = func(ids []string) ([]int, error) { return []int{peerNo, peerYes}, nil }
	comms, errs := newFakeComms(t, Config{}, devs)
	d := agreed(t, comms, errs)
	if d.Topology != "" || d.Kind != "none" || !strings.Contains(d.Reason, "rank 1's GPU") ||
		!strings.Contains(d.NoNVML, "rank 1: topo: nvmlInit: ERROR_LIBRARY_NOT_FOUND; libnvidia-ml.so.1 was not found: install the NVIDIA driver") {
		t.Errorf("one rank without access: %+v", d)
	}
	closeAll(t, comms)

	// No rank has NVML, every probe says yes: peer access, the NVLink
	// topology as before detection.
	devs = machineDevs(m, identity(2))
	noNVML(devs[0])
	noNVML(devs[1])
	comms, errs = newFakeComms(t, Config{}, devs)
	if d := agreed(t, comms, errs); d.Kind != kindProbed || d.Topology != "nvswitch" || d.NoNVML == "" {
		t.Errorf("probes only: %+v", d)
	}
	closeAll(t, comms)

	// A probe hidden from the process (CUDA_VISIBLE_DEVICES) is no vote
	// against.
	devs = machineDevs(m, identity(2))
	for _, dv := range devs {
		noNVML(dv)
		dv.peersFn = func(ids []string) ([]int, error) { return []int{peerUnknown, peerUnknown}, nil }
	}
	comms, errs = newFakeComms(t, Config{}, devs)
	if d := agreed(t, comms, errs); d.Kind != kindProbed || d.Topology != "nvswitch" {
		t.Errorf("hidden peers: %+v", d)
	}
	closeAll(t, comms)

	// Ranks that fail to agree fail together, at once, releasing their
	// devices: NVML disagreeing, a failing probe, a missing bus id.
	for _, tc := range []struct {
		name  string
		spoil func(devs []*fakeDevice)
		kind  error
		want  string
	}{
		{"nvml disagrees", func(devs []*fakeDevice) {
			devs[1].classifyFn = func([]string) (classification, error) { return classification{Kind: "none"}, nil }
		}, ErrMismatch, "NVML classifies the GPUs"},
		{"probe fails", func(devs []*fakeDevice) {
			noNVML(devs[0])
			devs[0].peersFn = func([]string) ([]int, error) { return nil, errors.New("cuDeviceCanAccessPeer: the device is lost") }
		}, ErrDevice, "probing peer access failed on rank 0: cuDeviceCanAccessPeer: the device is lost"},
		{"no bus id", func(devs []*fakeDevice) { devs[1].busErr = errors.New("cuDeviceGetPCIBusId: unknown error") },
			ErrDevice, "rank 1 cannot read its GPU's PCI bus id: cuDeviceGetPCIBusId: unknown error"},
	} {
		devs := machineDevs(m, identity(2))
		tc.spoil(devs)
		start := time.Now()
		_, errs := newFakeComms(t, Config{}, devs)
		for r, err := range errs {
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: rank %d: %v, want %v %q", tc.name, r, err, tc.kind, tc.want)
			}
			if !devs[r].released {
				t.Errorf("%s: rank %d's device not released", tc.name, r)
			}
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("%s: failing took %v", tc.name, el)
		}
	}
}
