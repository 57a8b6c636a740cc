package topo_test

import (
	"fmt"

	"github.com/collgen/collgen/runtime/topo"
	"github.com/collgen/collgen/runtime/topo/fakenvml"
)

// Classify a communicator's GPUs, given in rank order by their PCI bus ids
// (as cuda.Device.PCIBusID reports them), on a DGX-1.
func ExampleMachine_Classify() {
	lib, _ := fakenvml.New("dgx1") // on a real machine: m, err := topo.Open()
	m, err := topo.Detect(lib)
	if err != nil {
		fmt.Println(err) // errors.Is(err, topo.ErrNoNVML): probe peer access instead
		return
	}
	ids, _ := topo.ParseBusIDs([]string{"0000:06:00.0", "0000:85:00.0", "0000:07:00.0", "0000:86:00.0",
		"0000:0a:00.0", "0000:89:00.0", "0000:0b:00.0", "0000:8a:00.0"})
	c, _ := m.Classify(ids...)
	kind, _ := c.Kind.SpecKind()
	fmt.Println(c.Kind, kind)
	fmt.Println("corners:", c.Corners)

	quad, _ := m.Classify(ids[0], ids[2], ids[4], ids[6])
	fmt.Println(quad.Kind)
	// Output:
	// hybrid_cube_mesh hybrid_cube_mesh
	// corners: [0 4 1 5 2 6 3 7]
	// nvlink_mesh
}
