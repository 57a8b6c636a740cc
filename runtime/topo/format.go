package topo

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Cell is the connection matrix entry from GPU i to GPU j, as in
// `nvidia-smi topo -m`: "X" for the GPU itself, "NV<n>" for n direct
// NVLinks, "SW<n>" through the NVSwitch fabric (n: the fewer switch links of
// the two GPUs), else the PCIe path (PIX, PXB, PHB, NODE, SYS).
func (m *Machine) Cell(i, j int) string {
	switch {
	case i == j:
		return "X"
	case m.Pairs[i][j].NVLinks > 0:
		return "NV" + strconv.Itoa(m.Pairs[i][j].NVLinks)
	case m.viaSwitch(i, j):
		return "SW" + strconv.Itoa(min(m.GPUs[i].SwitchLinks(), m.GPUs[j].SwitchLinks()))
	}
	return m.Pairs[i][j].Level.String()
}

// CPUList formats CPU numbers as ranges, "0-19,40-59"; "?" for none.
func CPUList(cpus []int) string {
	if len(cpus) == 0 {
		return "?"
	}
	var b strings.Builder
	for k := 0; k < len(cpus); {
		e := k
		for e+1 < len(cpus) && cpus[e+1] == cpus[e]+1 {
			e++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if e > k {
			fmt.Fprintf(&b, "%d-%d", cpus[k], cpus[e])
		} else {
			fmt.Fprintf(&b, "%d", cpus[k])
		}
		k = e + 1
	}
	return b.String()
}

// numa formats a NUMA node, "?" where unknown.
func numa(n int) string {
	if n < 0 {
		return "?"
	}
	return strconv.Itoa(n)
}

// WriteReport writes what `collgen topo` prints: the GPU count and driver
// version, the GPUs with bus id,
// NUMA node, CPU affinity, active (and down) NVLinks, name and UUID; the connection matrix; the peer
// read matrix; a legend; and the classification c (nil: none).
func (m *Machine) WriteReport(w io.Writer, c *Classification) error {
	driver := m.Driver
	if driver == "" {
		driver = "unknown"
	}
	fmt.Fprintf(w, "%d GPUs, NVIDIA driver %s\n\n", len(m.GPUs), driver)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "GPU\tbus id\tNUMA\tCPU affinity\tNVLinks\tname\tUUID\n")
	for _, g := range m.GPUs {
		links := strconv.Itoa(len(g.Links))
		if g.DownLinks > 0 {
			links += fmt.Sprintf(" (%d down)", g.DownLinks)
		}
		fmt.Fprintf(tw, "GPU%d\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, g.BusID, numa(g.NUMANode), CPUList(g.CPUs), links, g.Name, g.UUID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, u := range m.Unusable {
		fmt.Fprintf(w, "left out: %s\n", u)
	}
	matrix := func(title string, cell func(i, j int) string) error {
		fmt.Fprintf(w, "\n%s\n", title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, g := range m.GPUs {
			fmt.Fprintf(tw, "\tGPU%d", g.Index)
		}
		fmt.Fprintln(tw)
		for i, g := range m.GPUs {
			fmt.Fprintf(tw, "GPU%d", g.Index)
			for j := range m.GPUs {
				fmt.Fprintf(tw, "\t%s", cell(i, j))
			}
			fmt.Fprintln(tw)
		}
		return tw.Flush()
	}
	if err := matrix("Connections (as nvidia-smi topo -m):", m.Cell); err != nil {
		return err
	}
	err := matrix("Peer reads (as nvidia-smi topo -p2p r):", func(i, j int) string {
		if i == j {
			return "X"
		}
		return m.Pairs[i][j].Read.String()
	})
	if err != nil {
		return err
	}
	fmt.Fprint(w, `
Legend:
  X      the GPU itself
  NV<n>  n direct NVLinks
  SW<n>  through the NVSwitch fabric (n: the fewer NVLinks into it of the two GPUs)
  PIX, PXB, PHB, NODE, SYS  no NVLink; the PCIe path: one switch, several switches,
         a host bridge, host bridges within a NUMA node, across NUMA nodes
  OK     peer reads work; CNS, GNS, TNS: not supported by the chipset, the GPU, the
         PCIe topology; DIS: disabled by a registry key; NS: not supported; U: unknown
`)
	if c == nil {
		return nil
	}
	fmt.Fprintf(w, "\nKind: %s", c.Kind)
	if sk, ok := c.Kind.SpecKind(); ok {
		fmt.Fprintf(w, " (spec kind %s)", sk)
	} else {
		fmt.Fprint(w, " (no generated kernel runs here; NCCL only)")
	}
	fmt.Fprintf(w, "\n  %s\n", c.Reason)
	if c.Kind == HybridCubeMesh {
		if !c.Remapped() {
			fmt.Fprintln(w, "  rank -> cube corner: identity (quads are ranks 0-3 and 4-7, rank r linked to r+4)")
		} else {
			var parts []string
			for r, k := range c.Corners {
				parts = append(parts, fmt.Sprintf("%d->%d", r, k))
			}
			fmt.Fprintf(w, "  rank -> cube corner: %s (the hcm kernel runs rank r as corner Corners[r])\n", strings.Join(parts, " "))
		}
	}
	return nil
}
