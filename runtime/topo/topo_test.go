package topo_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/topo"
	"github.com/collgen/collgen/runtime/topo/fakenvml"
	"github.com/collgen/collgen/schedule"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// detect runs Detect on a fake library and fails the test on error.
func detect(t *testing.T, lib nvml.Interface) *topo.Machine {
	t.Helper()
	m, err := topo.Detect(lib)
	if err != nil {
		t.Fatalf("Detect: %v", err)
	}
	return m
}

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update rewrites it)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestFakeMachines(t *testing.T) {
	want := map[string]topo.Kind{
		"dgx1":      topo.HybridCubeMesh,
		"nvswitch8": topo.NVSwitch,
		"pcie4":     topo.NoPeerAccess,
		"bridge2":   topo.NVLinkMesh,
	}
	if len(want) != len(fakenvml.Names()) {
		t.Fatalf("fakes %v, test knows %d", fakenvml.Names(), len(want))
	}
	for _, name := range fakenvml.Names() {
		t.Run(name, func(t *testing.T) {
			lib, err := fakenvml.New(name)
			if err != nil {
				t.Fatal(err)
			}
			m := detect(t, lib)
			c, err := m.Classify()
			if err != nil {
				t.Fatal(err)
			}
			if c.Kind != want[name] {
				t.Errorf("kind %s (%s), want %s", c.Kind, c.Reason, want[name])
			}
			var b bytes.Buffer
			if err := m.WriteReport(&b, c); err != nil {
				t.Fatal(err)
			}
			golden(t, name+".golden", b.Bytes())
		})
	}
	if _, err := fakenvml.New("dgx2"); err == nil || !strings.Contains(err.Error(), "known: bridge2, dgx1") {
		t.Errorf("unknown fake: %v", err)
	}
}

func TestDetectDGX1(t *testing.T) {
	m := detect(t, fakenvml.Build(fakenvml.DGX1()))
	if len(m.GPUs) != 8 {
		t.Fatalf("%d GPUs", len(m.GPUs))
	}
	g := m.GPUs[2]
	if g.BusID.String() != "0000:0a:00.0" || g.Name != "Tesla V100-SXM2-32GB" || g.NUMANode != 0 || len(g.Links) != 6 {
		t.Errorf("GPU 2: %+v", g)
	}
	if got := topo.CPUList(m.GPUs[5].CPUs); got != "20-39,60-79" {
		t.Errorf("GPU 5 CPUs %s", got)
	}
	if m.Pairs[0][3].NVLinks != 2 || m.Pairs[0][5].NVLinks != 0 || m.Pairs[0][5].Read != topo.P2PTopologyNotSupported {
		t.Errorf("pairs 0-3 %+v, 0-5 %+v", m.Pairs[0][3], m.Pairs[0][5])
	}
	if m.Cell(0, 4) != "NV2" || m.Cell(0, 5) != "SYS" || m.Cell(1, 1) != "X" {
		t.Errorf("cells %s %s %s", m.Cell(0, 4), m.Cell(0, 5), m.Cell(1, 1))
	}
}

// checkCube asserts that c is a hybrid cube mesh whose corner mapping puts
// every link the hcm schedule uses on an NVLink of m.
func checkCube(t *testing.T, m *topo.Machine, c *topo.Classification) {
	t.Helper()
	if c.Kind != topo.HybridCubeMesh || len(c.Corners) != 8 {
		t.Fatalf("kind %s corners %v: %s", c.Kind, c.Corners, c.Reason)
	}
	cube, err := schedule.NewTopology(coll.HybridCubeMesh, 8)
	if err != nil {
		t.Fatal(err)
	}
	rankAt := make([]int, 8)
	seen := map[int]bool{}
	for r, k := range c.Corners {
		if seen[k] {
			t.Fatalf("corner %d used twice: %v", k, c.Corners)
		}
		seen[k] = true
		rankAt[k] = r
	}
	for a := 0; a < 8; a++ {
		for b := 0; b < 8; b++ {
			if a == b || !cube.Linked(a, b) {
				continue
			}
			ga, gb := m.GPU(c.GPUs[rankAt[a]]), m.GPU(c.GPUs[rankAt[b]])
			if m.Pairs[ga][gb].NVLinks == 0 {
				t.Errorf("corners %d-%d are linked in the hcm schedule, but ranks %d-%d (GPUs %d-%d) have no NVLink",
					a, b, rankAt[a], rankAt[b], ga, gb)
			}
		}
	}
}

func TestCubeCorners(t *testing.T) {
	m := detect(t, fakenvml.Build(fakenvml.DGX1()))
	c, err := m.Classify()
	if err != nil {
		t.Fatal(err)
	}
	checkCube(t, m, c)
	if c.Remapped() {
		t.Errorf("NVML order on a DGX-1 is cube order, got corners %v", c.Corners)
	}
	// Ranks given in another order: the mapping must follow.
	order := []int{0, 4, 1, 5, 2, 6, 3, 7}
	var ids []topo.BusID
	for _, i := range order {
		ids = append(ids, m.GPUs[i].BusID)
	}
	c, err = m.Classify(ids...)
	if err != nil {
		t.Fatal(err)
	}
	checkCube(t, m, c)
	if !c.Remapped() {
		t.Errorf("interleaved ranks need a remapping, got identity")
	}

	// A cube whose NVML order is scrambled (bus ids permuted).
	l := fakenvml.DGX1()
	perm := []int{3, 6, 0, 5, 7, 1, 4, 2} // new index -> old index
	nv := make([][]int, 8)
	bus := make([]string, 8)
	for i := range nv {
		nv[i] = make([]int, 8)
		bus[i] = l.BusIDs[perm[i]]
		for j := range nv[i] {
			nv[i][j] = l.NVLinks[perm[i]][perm[j]]
		}
	}
	old := l.P2P
	l.NVLinks, l.BusIDs = nv, bus
	l.P2P = func(i, j int) nvml.GpuP2PStatus { return old(perm[i], perm[j]) }
	m = detect(t, fakenvml.Build(l))
	c, err = m.Classify()
	if err != nil {
		t.Fatal(err)
	}
	checkCube(t, m, c)
}

func TestCubeNeedsAllLinks(t *testing.T) {
	// A DGX-1 with one quad link down (and all peer reads allowed) is PCIe.
	l := fakenvml.DGX1()
	nv := make([][]int, 8)
	for i := range nv {
		nv[i] = append([]int(nil), l.NVLinks[i]...)
	}
	nv[1][2], nv[2][1] = 0, 0
	l.NVLinks = nv
	l.Down = []int{0, 2, 2, 0, 0, 0, 0, 0} // their two links to each other, down
	l.P2P = func(i, j int) nvml.GpuP2PStatus { return nvml.P2P_STATUS_OK }
	m := detect(t, fakenvml.Build(l))
	c, err := m.Classify()
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != topo.PCIe || c.Corners != nil {
		t.Errorf("kind %s corners %v", c.Kind, c.Corners)
	}
	if !strings.Contains(c.Reason, "not a hybrid cube mesh either") || !strings.Contains(c.Reason, "GPU 2 (0000:0a:00.0) has 2 NVLink(s) down") {
		t.Errorf("reason %q", c.Reason)
	}
	if m.GPUs[1].DownLinks != 2 || len(m.GPUs[1].Links) != 4 {
		t.Errorf("GPU 1: %d links, %d down", len(m.GPUs[1].Links), m.GPUs[1].DownLinks)
	}
	var b bytes.Buffer
	m.WriteReport(&b, c)
	if !strings.Contains(b.String(), "\nGPU1  0000:07:00.0  0     0-19,40-59    4 (2 down)  Tesla") {
		t.Errorf("report:\n%s", b.String())
	}
}

func TestSubsets(t *testing.T) {
	dgx := detect(t, fakenvml.Build(fakenvml.DGX1()))
	nvs := detect(t, fakenvml.NVSwitch8())
	bus := func(m *topo.Machine, idx ...int) []topo.BusID {
		var ids []topo.BusID
		for _, i := range idx {
			ids = append(ids, m.GPUs[i].BusID)
		}
		return ids
	}
	cases := []struct {
		name string
		m    *topo.Machine
		gpus []int
		want topo.Kind
	}{
		{"dgx1 quad", dgx, []int{0, 1, 2, 3}, topo.NVLinkMesh},
		{"dgx1 other quad reversed", dgx, []int{7, 6, 5, 4}, topo.NVLinkMesh},
		{"dgx1 counterparts", dgx, []int{2, 6}, topo.NVLinkMesh},
		{"dgx1 across sockets", dgx, []int{0, 5}, topo.NoPeerAccess},
		{"dgx1 half quads", dgx, []int{0, 1, 4, 5}, topo.NoPeerAccess},
		{"dgx1 one", dgx, []int{3}, topo.NoPeerAccess},
		{"nvswitch 3", nvs, []int{1, 4, 6}, topo.NVSwitch},
		{"nvswitch 8", nvs, []int{7, 6, 5, 4, 3, 2, 1, 0}, topo.NVSwitch},
	}
	for _, tc := range cases {
		c, err := tc.m.Classify(bus(tc.m, tc.gpus...)...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.Kind != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.name, c.Kind, c.Reason, tc.want)
		}
		if len(c.GPUs) != len(tc.gpus) || c.GPUs[0] != tc.m.GPUs[tc.gpus[0]].BusID {
			t.Errorf("%s: GPUs %v", tc.name, c.GPUs)
		}
	}
	c, _ := dgx.Classify(bus(dgx, 0, 5)...)
	if !strings.Contains(c.Reason, "GPU 0 (0000:06:00.0) cannot read GPU 5 (0000:86:00.0)") ||
		!strings.Contains(c.Reason, "PCIe topology") {
		t.Errorf("reason %q", c.Reason)
	}

	unknown, _ := topo.ParseBusID("0000:ff:00.0")
	_, err := dgx.Classify(dgx.GPUs[0].BusID, unknown)
	if !errors.Is(err, topo.ErrUnknownGPU) || !strings.Contains(err.Error(), "rank 1's GPU 0000:ff:00.0") {
		t.Errorf("unknown GPU: %v", err)
	}
	_, err = dgx.Classify(dgx.GPUs[0].BusID, dgx.GPUs[0].BusID)
	if err == nil || !strings.Contains(err.Error(), "ranks 0 and 1 both name GPU 0000:06:00.0") {
		t.Errorf("repeated GPU: %v", err)
	}
}

func TestOldDriver(t *testing.T) {
	// Without nvmlDeviceGetNvLinkRemoteDeviceType, a link to another GPU's
	// bus id is a GPU link and any other far end is a switch; without
	// nvmlDeviceGetNumaNodeId the node is unknown. The fakes panic if the
	// missing symbols are called anyway.
	l := fakenvml.NVSwitch8Layout()
	l.OldDriver = true
	m := detect(t, fakenvml.Build(l))
	if m.GPUs[0].SwitchLinks() != 12 || m.GPUs[0].NUMANode != -1 {
		t.Errorf("GPU 0: %d switch links, NUMA %d", m.GPUs[0].SwitchLinks(), m.GPUs[0].NUMANode)
	}
	if c, _ := m.Classify(); c.Kind != topo.NVSwitch {
		t.Errorf("kind %s", c.Kind)
	}
	// Switch ports without a PCI bus id still count, with or without the
	// remote device type.
	for _, old := range []bool{false, true} {
		l := fakenvml.NVSwitch8Layout()
		l.SwitchNoPCI, l.OldDriver = true, old
		m := detect(t, fakenvml.Build(l))
		if c, _ := m.Classify(); c.Kind != topo.NVSwitch || m.GPUs[3].SwitchLinks() != 12 {
			t.Errorf("switch ports without bus ids (old driver %v): %s, %d switch links", old, c.Kind, m.GPUs[3].SwitchLinks())
		}
	}
	// H100/H200 NVSwitch systems answer nvmlDeviceGetNvLinkRemotePciInfo
	// on switch ports with the all-ones id "FFFFFFFF:FF:FF.0" (seen on
	// nvidia-h200-x2): not a bus id, so the port counts as a switch link.
	for _, old := range []bool{false, true} {
		l := fakenvml.NVSwitch8Layout()
		l.Switches, l.OldDriver = []string{"FFFFFFFF:FF:FF.0"}, old
		m := detect(t, fakenvml.Build(l))
		if c, _ := m.Classify(); c.Kind != topo.NVSwitch || m.GPUs[5].SwitchLinks() != 12 {
			t.Errorf("switch ports with all-ones bus ids (old driver %v): %s, %d switch links", old, c.Kind, m.GPUs[5].SwitchLinks())
		}
	}
	d := fakenvml.DGX1()
	d.OldDriver = true
	m = detect(t, fakenvml.Build(d))
	if c, _ := m.Classify(); c.Kind != topo.HybridCubeMesh {
		t.Errorf("kind %s", c.Kind)
	}
}

func TestNoNVML(t *testing.T) {
	for _, r := range []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NO_PERMISSION} {
		lib := &mock.Interface{InitFunc: func() nvml.Return { return r }}
		_, err := topo.Detect(lib)
		if !errors.Is(err, topo.ErrNoNVML) {
			t.Errorf("%v: %v does not wrap ErrNoNVML", r, err)
		}
		var ne *topo.NVMLError
		if !errors.As(err, &ne) || ne.Return != r || ne.Op != "nvmlInit" {
			t.Errorf("%v: %#v", r, err)
		}
	}
	_, err := topo.Detect(&mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }})
	if !strings.Contains(err.Error(), "libnvidia-ml.so.1 was not found: install the NVIDIA driver") {
		t.Errorf("message %q", err)
	}
	// A failure after Init is not "no NVML", and NVML is shut down again.
	shut := 0
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { shut++; return nvml.SUCCESS },
		ExtensionsFunc:             func() nvml.ExtendedInterface { return nil },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST },
	}
	_, err = topo.Detect(lib)
	if err == nil || errors.Is(err, topo.ErrNoNVML) || shut != 1 || !strings.Contains(err.Error(), "nvmlDeviceGetCount") {
		t.Errorf("count failure: %v (shutdowns %d)", err, shut)
	}
}

func TestParseBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:0A:00.0": "0000:0a:00.0",
		"0000:3b:00.1":     "0000:3b:00.1",
		"07:00.0":          "0000:07:00.0",
		" 0001:C1:1F.7 ":   "0001:c1:1f.7",
	} {
		b, err := topo.ParseBusID(in)
		if err != nil || b.String() != want {
			t.Errorf("%q: %v %v, want %s", in, b, err, want)
		}
	}
	ids, err := topo.ParseBusIDs([]string{"0000:07:00.0", "0000:0F:00.0"})
	if err != nil || len(ids) != 2 || ids[1].String() != "0000:0f:00.0" {
		t.Errorf("ParseBusIDs: %v %v", ids, err)
	}
	if _, err := topo.ParseBusIDs([]string{"0000:07:00.0", "07:00"}); err == nil || !strings.HasPrefix(err.Error(), "rank 1: topo: bad PCI bus id") {
		t.Errorf("ParseBusIDs: %v", err)
	}
	for _, in := range []string{"", "0000:07:00", "0000:07:20.0", "0000:100:00.0", "0000:07:00.8", "x:07:00.0", "1:2:3:4.0"} {
		if _, err := topo.ParseBusID(in); err == nil {
			t.Errorf("%q parsed", in)
		}
	}
}

// TestRealMachine runs on whatever this machine has: skipped without NVML
// (the error must then wrap ErrNoNVML); on a GPU machine it detects and
// classifies every GPU and logs the report.
func TestRealMachine(t *testing.T) {
	m, err := topo.Open()
	if errors.Is(err, topo.ErrNoNVML) {
		t.Skipf("no NVML here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.Classify()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := m.WriteReport(&b, c); err != nil {
		t.Fatal(err)
	}
	t.Logf("driver %s\n%s", m.Driver, b.String())
	for i, g := range m.GPUs {
		if g.UUID == "" || g.Name == "" {
			t.Errorf("GPU %d: %+v", i, g)
		}
	}
	if len(m.GPUs) >= 2 && c.Kind == topo.NoPeerAccess {
		t.Logf("no peer access between these GPUs: %s", c.Reason)
	}
}

func TestWorldKinds(t *testing.T) {
	cases := map[string]map[topo.Kind][]int{
		"dgx1": {
			topo.NVLinkMesh:     {2, 3, 4},
			topo.NoPeerAccess:   {2, 3, 4, 5, 6, 7},
			topo.HybridCubeMesh: {8},
		},
		"nvswitch8": {topo.NVSwitch: {2, 3, 4, 5, 6, 7, 8}},
		"pcie4":     {topo.NoPeerAccess: {2, 3, 4}},
		"bridge2":   {topo.NVLinkMesh: {2}},
	}
	for name, want := range cases {
		lib, _ := fakenvml.New(name)
		got := detect(t, lib).WorldKinds()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
}

func TestJSON(t *testing.T) {
	for _, name := range fakenvml.Names() {
		lib, _ := fakenvml.New(name)
		m := detect(t, lib)
		var b bytes.Buffer
		if err := m.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		back, err := topo.ReadJSON(bytes.NewReader(b.Bytes()))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(m, back) {
			t.Errorf("%s: round trip differs", name)
		}
		if name == "dgx1" && (!strings.Contains(b.String(), `"BusID": "0000:06:00.0"`) || !strings.Contains(b.String(), `"Read": "TNS"`)) {
			t.Errorf("dgx1 JSON:\n%s", b.String())
		}
	}
	for in, want := range map[string]string{
		`{"GPUs": [{"BusID": "x"}], "Pairs": [[{}]]}`:    "bad PCI bus id",
		`{"GPUs": [{}], "Pairs": [[{"Read": "MAYBE"}]]}`: `unknown P2P status "MAYBE"`,
		`{"GPUs": [{}], "Pairs": []}`:                    "1 GPUs but 0 rows",
		`{"GPUs": [{}], "Pairs": [[]]}`:                  "row 0 of pairs has 0 entries",
		`{"GPU": []}`:                                    "unknown field",
	} {
		if _, err := topo.ReadJSON(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %s", in, err, want)
		}
	}
}

// TestReadJSONNoGPUs: a machine file holding no GPUs ({}) is an error (it
// printed a report of zero GPUs and exited 0).
func TestReadJSONNoGPUs(t *testing.T) {
	for _, in := range []string{`{}`, `{"GPUs": [], "Pairs": []}`} {
		if _, err := topo.ReadJSON(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), "no GPUs") {
			t.Errorf("ReadJSON(%s): %v; want an error saying it holds no GPUs", in, err)
		}
	}
}

// TestReadJSONDuplicateBusIDs: a machine file naming one bus id for two
// GPUs (hand-edited, or GPUs without a BusID, which all read as
// 0000:00:00.0) is an error: bus ids are how ranks find their GPUs, and
// Classify would silently take the first of the two.
func TestReadJSONDuplicateBusIDs(t *testing.T) {
	for _, in := range []string{
		`{"GPUs": [{"BusID": "0000:07:00.0"}, {"BusID": "00000000:07:00.0"}], "Pairs": [[{}, {}], [{}, {}]]}`,
		`{"GPUs": [{"Index": 0}, {"Index": 1}], "Pairs": [[{}, {}], [{}, {}]]}`,
	} {
		if _, err := topo.ReadJSON(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), "GPUs 0 and 1 both have bus id") {
			t.Errorf("ReadJSON(%s): %v; want an error naming the repeated bus id", in, err)
		}
	}
}

// TestAsymmetricNVLinks: where only one end of a pair reports an NVLink
// (the other's link is down or cannot name its peer), the kind must not
// depend on the order the ranks name the GPUs in: the pair has no working
// NVLink either way.
func TestAsymmetricNVLinks(t *testing.T) {
	l := fakenvml.Layout{
		Name:    "test GPU",
		BusIDs:  []string{"00000000:01:00.0", "00000000:02:00.0", "00000000:03:00.0"},
		NVLinks: [][]int{{0, 2, 2}, {2, 0, 0}, {2, 1, 0}}, // GPU 2 sees a link to GPU 1; GPU 1 does not
		P2P:     func(i, j int) nvml.GpuP2PStatus { return nvml.P2P_STATUS_OK },
		Level:   func(i, j int) nvml.GpuTopologyLevel { return nvml.TOPOLOGY_HOSTBRIDGE },
	}
	m := detect(t, fakenvml.Build(l))
	g := func(i ...int) []topo.BusID {
		var ids []topo.BusID
		for _, k := range i {
			ids = append(ids, m.GPUs[k].BusID)
		}
		return ids
	}
	for _, order := range [][]int{{0, 1, 2}, {0, 2, 1}, {2, 1}, {1, 2}} {
		c, err := m.Classify(g(order...)...)
		if err != nil {
			t.Fatal(err)
		}
		if c.Kind != topo.PCIe {
			t.Errorf("ranks on GPUs %v: %s (%s), want %s", order, c.Kind, c.Reason, topo.PCIe)
		}
	}
}

// TestMIG: a GPU with MIG enabled is split into instances that have no
// peer access to any other GPU (NVLink or PCIe), whatever NVML's P2P status
// says of the whole GPU: a set holding it has no peer access (NCCL only),
// and the set without it keeps its kind.
func TestMIG(t *testing.T) {
	lib := fakenvml.NVSwitch8()
	d, _ := lib.DeviceGetHandleByIndex(3)
	if _, r := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); r != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v", r)
	}
	m := detect(t, lib)
	if !m.GPUs[3].MIG || m.GPUs[2].MIG {
		t.Errorf("MIG: GPU 3 %v, GPU 2 %v", m.GPUs[3].MIG, m.GPUs[2].MIG)
	}
	c, err := m.Classify()
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != topo.NoPeerAccess || !strings.Contains(c.Reason, "GPU 3 (0000:4e:00.0) has MIG enabled") {
		t.Errorf("nvswitch8 with MIG on GPU 3: %s (%s)", c.Kind, c.Reason)
	}
	if c, _ := m.Classify(m.GPUs[0].BusID, m.GPUs[5].BusID); c.Kind != topo.NVSwitch {
		t.Errorf("GPUs 0 and 5: %s (%s)", c.Kind, c.Reason)
	}
	// The same on a layout (and a DGX-1 whose quads would be a cube).
	l := fakenvml.DGX1()
	l.MIG = []bool{false, false, false, false, false, false, false, true}
	m = detect(t, fakenvml.Build(l))
	if c, _ := m.Classify(); c.Kind != topo.NoPeerAccess || c.Corners != nil {
		t.Errorf("dgx1 with MIG on GPU 7: %s %v (%s)", c.Kind, c.Corners, c.Reason)
	}
	if got := fmt.Sprint(m.WorldKinds()[topo.NVLinkMesh]); got != "[2 3 4]" {
		t.Errorf("dgx1 with MIG on GPU 7: nvlink_mesh at %s", got)
	}
	var b bytes.Buffer
	m.WriteJSON(&b)
	back, err := topo.ReadJSON(&b)
	if err != nil || !back.GPUs[7].MIG {
		t.Errorf("JSON round trip lost MIG: %v", err)
	}
}

// TestLostGPU: a GPU NVML lists but cannot read (fallen off the bus,
// ERROR_GPU_IS_LOST; or a device node this container may not open) is left
// out of the machine and named in it, as nvidia-smi does, rather than
// failing detection of the healthy GPUs (the communicator then fell back
// to CUDA probing on every rank of an unrelated group).
func TestLostGPU(t *testing.T) {
	for _, how := range []string{"handle", "pci"} {
		lib := fakenvml.Build(fakenvml.NVSwitch8Layout()).(*mock.Interface)
		if get := lib.DeviceGetHandleByIndexFunc; how == "handle" {
			lib.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
				if i == 5 {
					return nil, nvml.ERROR_GPU_IS_LOST
				}
				return get(i)
			}
		} else {
			d, _ := get(5)
			d.(*mock.Device).GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.ERROR_GPU_IS_LOST }
		}
		m, err := topo.Detect(lib)
		if err != nil {
			t.Fatalf("%s: Detect: %v", how, err)
		}
		// go-nvml renders a Return with nvmlErrorString ("GPU is lost")
		// once libnvidia-ml is loaded, and by its constant's name without it.
		if len(m.GPUs) != 7 || m.GPUs[5].Index != 6 || len(m.Unusable) != 1 || !strings.Contains(m.Unusable[0], "GPU 5") ||
			!strings.Contains(m.Unusable[0], "GPU is lost") && !strings.Contains(m.Unusable[0], "ERROR_GPU_IS_LOST") {
			t.Fatalf("%s: %d GPUs (GPUs[5] is NVML's %d), unusable %q", how, len(m.GPUs), m.GPUs[5].Index, m.Unusable)
		}
		if c, _ := m.Classify(); c.Kind != topo.NVSwitch {
			t.Errorf("%s: the 7 healthy GPUs: %s (%s)", how, c.Kind, c.Reason)
		}
		var b bytes.Buffer
		if err := m.WriteReport(&b, nil); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), "left out: topo: nvmlDevice") || !strings.Contains(b.String(), "\nGPU6  0000:b7:00.0") {
			t.Errorf("%s: report:\n%s", how, b.String())
		}
	}
}

// partitions is an NVSwitch8 layout whose fabric the fabric manager split
// into GPUs 0-3 and 4-7.
func partitions() (fakenvml.Layout, func(i, j int) bool) {
	apart := func(i, j int) bool { return i/4 != j/4 }
	return fakenvml.NVSwitch8Layout(), apart
}

// TestPartitionedSwitch: GPUs of different partitions of an NVSwitch fabric
// each have NVLinks into the switches, but not to each other: NVML's NVLink
// P2P status between them is "not supported". Where they still read each
// other over PCIe, the 8 GPUs were classified nvswitch (every GPU on the
// switches, every pair reading), and nvlink_full kernels ran over PCIe; the
// read status alone catches only partitions without PCIe peer reads.
func TestPartitionedSwitch(t *testing.T) {
	l, apart := partitions()
	l.NVLinkP2P = func(i, j int) nvml.GpuP2PStatus {
		if apart(i, j) {
			return nvml.P2P_STATUS_NOT_SUPPORTED
		}
		return nvml.P2P_STATUS_OK
	}
	m := detect(t, fakenvml.Build(l))
	if p := m.Pairs[0][4]; p.Read != topo.P2POK || p.NVLinkP2P != topo.P2PNotSupported {
		t.Fatalf("GPU 0 -> 4: read %s, NVLink %s", p.Read, p.NVLinkP2P)
	}
	c, err := m.Classify()
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != topo.PCIe || !strings.Contains(c.Reason, "GPU 0 (0000:07:00.0) has no NVLink peer access to GPU 4 (0000:87:00.0): not supported") {
		t.Errorf("two partitions reading over PCIe: %s (%s)", c.Kind, c.Reason)
	}
	if c, _ := m.Classify(m.GPUs[4].BusID, m.GPUs[5].BusID, m.GPUs[6].BusID, m.GPUs[7].BusID); c.Kind != topo.NVSwitch {
		t.Errorf("one partition: %s (%s)", c.Kind, c.Reason)
	}
	if got := fmt.Sprint(m.WorldKinds()); got != "map[nvswitch:[2 3 4] pcie_p2p:[2 3 4 5 6 7 8]]" {
		t.Errorf("world kinds %s", got)
	}
	if m.Cell(0, 1) != "SW12" || m.Cell(0, 4) != "SYS" {
		t.Errorf("connections 0-1 %s, 0-4 %s; want SW12 and the PCIe path SYS", m.Cell(0, 1), m.Cell(0, 4))
	}
	// One direction alone is enough (an asymmetric answer).
	l.NVLinkP2P = func(i, j int) nvml.GpuP2PStatus {
		if i == 6 && j == 2 {
			return nvml.P2P_STATUS_NOT_SUPPORTED
		}
		return nvml.P2P_STATUS_OK
	}
	if c, _ := detect(t, fakenvml.Build(l)).Classify(); c.Kind != topo.PCIe || !strings.Contains(c.Reason, "GPU 6 (0000:b7:00.0) has no NVLink peer access to GPU 2") {
		t.Errorf("GPU 6 -> 2 not supported: %s (%s)", c.Kind, c.Reason)
	}
	// Partitions that do not read each other over PCIe either were caught
	// by the read status already.
	l.P2P = func(i, j int) nvml.GpuP2PStatus {
		if apart(i, j) {
			return nvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
		}
		return nvml.P2P_STATUS_OK
	}
	l.NVLinkP2P = nil
	if c, _ := detect(t, fakenvml.Build(l)).Classify(); c.Kind != topo.NoPeerAccess {
		t.Errorf("partitions without PCIe reads: %s (%s)", c.Kind, c.Reason)
	}
}

// TestFabricCliques: nvmlDeviceGetGpuFabricInfo places every GPU of an
// NVLink fabric in a cluster and clique; GPUs of different ones (fabric
// partitions, an NVL72 rack's cliques) are no NVLink peers, even where
// the per-pair statuses say OK. Where NVML cannot tell (no fabric, an
// older driver, registration unfinished or failed), nothing changes.
func TestFabricCliques(t *testing.T) {
	info := func(cluster byte, clique uint32) nvml.GpuFabricInfo {
		fi := nvml.GpuFabricInfo{CliqueId: clique, State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS)}
		fi.ClusterUuid[0], fi.ClusterUuid[15] = cluster, 0xab
		return fi
	}
	l, _ := partitions()
	l.Fabric = make([]nvml.GpuFabricInfo, 8)
	for i := range l.Fabric {
		l.Fabric[i] = info(1, uint32(1+i/4))
	}
	m := detect(t, fakenvml.Build(l))
	if f := m.GPUs[5].Fabric; f == nil || *f != (topo.Fabric{Cluster: "01000000-0000-0000-0000-0000000000ab", Clique: 2}) {
		t.Fatalf("GPU 5's fabric %+v", f)
	}
	c, _ := m.Classify()
	if c.Kind != topo.PCIe || !strings.Contains(c.Reason, "GPU 0 (0000:07:00.0) and GPU 4 (0000:87:00.0) are in different NVLink fabric partitions (cluster 01000000-0000-0000-0000-0000000000ab clique 1, cluster 01000000-0000-0000-0000-0000000000ab clique 2)") {
		t.Errorf("two cliques: %s (%s)", c.Kind, c.Reason)
	}
	if c, _ := m.Classify(m.GPUs[0].BusID, m.GPUs[3].BusID); c.Kind != topo.NVSwitch {
		t.Errorf("one clique: %s (%s)", c.Kind, c.Reason)
	}
	if m.Cell(1, 2) != "SW12" || m.Cell(1, 6) != "SYS" {
		t.Errorf("connections 1-2 %s, 1-6 %s", m.Cell(1, 2), m.Cell(1, 6))
	}
	// Another cluster with the same clique id is apart too.
	l.Fabric[7] = info(2, 1)
	for i := 4; i < 7; i++ {
		l.Fabric[i] = info(1, 1)
	}
	if c, _ := detect(t, fakenvml.Build(l)).Classify(); c.Kind != topo.PCIe || !strings.Contains(c.Reason, "GPU 0 (0000:07:00.0) and GPU 7") {
		t.Errorf("GPU 7 in another cluster: %s (%s)", c.Kind, c.Reason)
	}
	// Saved and read back, the fabric still splits the machine; a GPU
	// without one writes no "Fabric" (older readers' format).
	var b bytes.Buffer
	m.WriteJSON(&b)
	back, err := topo.ReadJSON(&b)
	if err != nil || back.GPUs[6].Fabric == nil || back.GPUs[6].Fabric.Clique != 2 {
		t.Fatalf("JSON round trip: %v", err)
	}
	if c, _ := back.Classify(); c.Kind != topo.PCIe {
		t.Errorf("read back: %s (%s)", c.Kind, c.Reason)
	}
	b.Reset()
	detect(t, fakenvml.NVSwitch8()).WriteJSON(&b)
	if strings.Contains(b.String(), "Fabric") {
		t.Errorf("a machine without fabric info writes a Fabric field")
	}
	// Unknown: one whole GPU (or all) keeps today's answer, nvswitch.
	unknown := map[string]func(*fakenvml.Layout){
		"NOT_SUPPORTED":       func(l *fakenvml.Layout) { l.Fabric = nil },
		"older driver":        func(l *fakenvml.Layout) { l.OldDriver = true },
		"in progress":         func(l *fakenvml.Layout) { l.Fabric[4].State = nvml.GPU_FABRIC_STATE_IN_PROGRESS },
		"not started":         func(l *fakenvml.Layout) { l.Fabric[4].State = nvml.GPU_FABRIC_STATE_NOT_STARTED },
		"registration failed": func(l *fakenvml.Layout) { l.Fabric[4].Status = uint32(nvml.ERROR_UNKNOWN) },
	}
	for name, set := range unknown {
		l, _ := partitions()
		l.Fabric = make([]nvml.GpuFabricInfo, 8)
		for i := range l.Fabric {
			l.Fabric[i] = info(1, 1)
		}
		l.Fabric[4] = info(1, 2) // GPU 4 alone in another clique, if NVML can tell
		set(&l)
		m := detect(t, fakenvml.Build(l))
		if m.GPUs[4].Fabric != nil {
			t.Errorf("%s: GPU 4's fabric %+v, want unknown", name, m.GPUs[4].Fabric)
		}
		if c, _ := m.Classify(); c.Kind != topo.NVSwitch {
			t.Errorf("%s: %s (%s)", name, c.Kind, c.Reason)
		}
	}
}
