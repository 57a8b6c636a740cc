package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/runtime/topo"
	"github.com/collgen/collgen/runtime/topo/fakenvml"
	"github.com/collgen/collgen/spec"
	"github.com/collgen/collgen/tune"
)

func init() {
	register("topo", func(io *IO) *cobra.Command { return newCmdTopo(io, &topoOptions{}, nil) })
}

// topoOptions are `collgen topo`'s flags and the source of the machine.
type topoOptions struct {
	Spec    string   // write a spec for this machine to this file ("-": stdout)
	Base    string   // take package, dtypes, ops, launch parameters, rules and host topologies from this spec
	GPUs    []string // classify only these bus ids, in rank order
	JSON    bool     // print the machine as JSON instead of the report
	Machine string   // read the machine from this JSON file instead of NVML
	Fake    string   // hidden: use a fake machine from fakenvml instead of NVML
	Force   bool     // with Spec: replace an existing file

	// Detect reads the machine; nil means NVML, or the fake named by Fake.
	Detect func() (*topo.Machine, error)
}

// machine reads the machine from o.Detect, the fake, or NVML.
func (o *topoOptions) machine() (*topo.Machine, error) {
	switch {
	case o.Detect != nil:
		return o.Detect()
	case o.Machine != "":
		f, err := os.Open(o.Machine)
		if err != nil {
			return nil, fmt.Errorf("--machine: %w", err)
		}
		defer f.Close()
		m, err := topo.ReadJSON(f)
		if err != nil {
			return nil, fmt.Errorf("--machine %s: %w", o.Machine, err)
		}
		return m, nil
	case o.Fake != "":
		lib, err := fakenvml.New(o.Fake)
		if err != nil {
			return nil, usageError(fmt.Errorf("--fake: %w", err))
		}
		return topo.Detect(lib)
	}
	return topo.Open()
}

// newCmdTopo builds `collgen topo`; runF, when not nil, replaces the run
// (tests check flag parsing with it).
func newCmdTopo(io *IO, o *topoOptions, runF func(*topoOptions) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topo",
		Short: "Show this machine's GPU interconnect (NVLink, NVSwitch, PCIe P2P) and its collgen topology kind",
		Long: `Topo reads every GPU, NVLink and peer-to-peer capability from NVML
(libnvidia-ml, loaded at run time) and prints the connection matrix in the
style of nvidia-smi topo -m, the peer-read matrix, each GPU's NUMA node and
CPU affinity, and the topology kind collgen sees: nvswitch, nvlink_mesh,
hybrid_cube_mesh (with the rank-to-corner map the hcm kernel needs),
pcie_p2p, or none.

--gpus classifies only the GPUs at the given PCI bus ids, in rank order, as a
communicator over those GPUs would. --json prints the machine as JSON, and
--machine FILE reads such a file instead of NVML (a machine saved on a GPU
host becomes a fixture anywhere). --spec writes a spec for this machine
that collgen generate accepts as it is: one topology per kind that some set
of its GPUs has, with the world sizes at which it has it. Add --base to carry
package, dtypes, ops, launch parameters, select rules and host_shm
topologies over from an existing spec (e.g. --base spec); then measure rules
with collgen tune.`,
		Example: `  collgen topo
  collgen topo --gpus 0000:07:00.0,0000:0f:00.0
  collgen topo --json > machine.json; collgen topo --machine machine.json
  collgen topo --spec machine.yaml --base spec && collgen generate --spec machine.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(o)
			}
			return runTopo(io, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Spec, "spec", "", "write a spec for this machine to `FILE` (- for stdout); an existing FILE is refused without --force")
	f.BoolVar(&o.Force, "force", false, "with --spec: replace FILE if it exists")
	f.StringVar(&o.Base, "base", "", "with --spec: take package, dtypes, ops, launch parameters, select rules and host_shm topologies from this `SPEC` (file or directory)")
	f.StringSliceVar(&o.GPUs, "gpus", nil, "classify only these GPUs, by PCI bus id, in rank order (`ID,ID,...`)")
	f.BoolVar(&o.JSON, "json", false, "print the machine as JSON (read back with --machine) instead of the report")
	f.StringVar(&o.Machine, "machine", "", "read the machine from a `FILE` written by --json instead of NVML")
	f.StringVar(&o.Fake, "fake", "", "use a fake machine ("+strings.Join(fakenvml.Names(), ", ")+") instead of NVML")
	_ = f.MarkHidden("fake")
	return cmd
}

// runTopo detects the machine, prints the report and writes the spec.
func runTopo(io *IO, o *topoOptions) error {
	ids, err := topo.ParseBusIDs(o.GPUs)
	if err != nil {
		return usageError(fmt.Errorf("--gpus: %w", err))
	}
	if o.JSON && o.Spec != "" {
		return usageError(errors.New("--json and --spec both write to stdout or a file; give one"))
	}
	if o.Base != "" && o.Spec == "" {
		return usageError(errors.New("--base needs --spec FILE: it only shapes the written spec"))
	}
	if o.Force && o.Spec == "" {
		return usageError(errors.New("--force needs --spec FILE: it only lets --spec replace a file"))
	}
	if len(ids) > 0 && (o.JSON || o.Spec == "-") {
		what := "--json"
		if !o.JSON {
			what = "--spec -"
		}
		return usageError(fmt.Errorf("--gpus only classifies for the report; %s writes the whole machine (with no report), so it would ignore --gpus", what))
	}
	if o.Spec != "" && o.Spec != "-" {
		// Refuse a spec path that cannot be written before the report,
		// not after it.
		if fi, err := os.Stat(filepath.Dir(o.Spec)); err != nil || !fi.IsDir() {
			return usageError(fmt.Errorf("--spec %s: directory %s does not exist", o.Spec, filepath.Dir(o.Spec)))
		}
		// --spec reads as an input elsewhere: never overwrite a hand-tuned
		// spec by surprise.
		if fi, err := os.Stat(o.Spec); err == nil && fi.IsDir() {
			return usageError(fmt.Errorf("--spec %s is a directory; name a file", o.Spec))
		} else if err == nil && !o.Force {
			return usageError(fmt.Errorf("--spec %s exists; collgen topo writes a new spec there: pass --force to replace it, or another file", o.Spec))
		}
	}
	m, err := o.machine()
	if err != nil {
		return err
	}
	c, err := m.Classify(ids...)
	if err != nil {
		return err
	}
	if o.JSON {
		return m.WriteJSON(io.Out)
	}
	if o.Spec == "-" {
		return writeMachineSpec(io, o, m)
	}
	if err := m.WriteReport(io.Out, c); err != nil {
		return err
	}
	if o.Spec != "" {
		return writeMachineSpec(io, o, m)
	}
	return nil
}

// writeMachineSpec writes the machine's spec to o.Spec, after checking that
// the spec loader accepts it.
func writeMachineSpec(io *IO, o *topoOptions, m *topo.Machine) error {
	opts := tune.SpecOptions{}
	if o.Base != "" {
		base, err := spec.Load(o.Base)
		if err != nil {
			return fmt.Errorf("--base %s: %w", o.Base, err)
		}
		opts.Base, opts.BaseName = base, o.Base
	}
	out, err := tune.MachineSpec(m, opts)
	if err != nil {
		return err
	}
	s, err := spec.Parse(o.Spec, out)
	if err != nil {
		return fmt.Errorf("internal error: the spec written for this machine does not load:\n%w", err)
	}
	if o.Spec == "-" {
		_, err := io.Out.Write(out)
		return err
	}
	// runTopo refused an existing file without --force before the report;
	// writeFileNew refuses one created since.
	write := writeFileAtomic
	if !o.Force {
		write = writeFileNew
	}
	if err := write(o.Spec, out, 0o644); errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("--spec %s was created while collgen topo ran; pass --force to replace it, or another file", o.Spec)
	} else if err != nil {
		return fmt.Errorf("--spec: %w", err)
	}
	fmt.Fprintf(io.Out, "\nwrote %s:", o.Spec)
	for _, t := range s.Topologies {
		fmt.Fprintf(io.Out, " %s (%s, world sizes %s)", t.Name, t.Kind, strings.Join(spec.WorldRanges(t.WorldSizes), ","))
	}
	fmt.Fprintln(io.Out)
	return nil
}
