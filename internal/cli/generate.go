package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/gen"
	"github.com/collgen/collgen/spec"
)

func init() {
	register("generate", newCmdGenerate)
	register("check", newCmdCheck)
	register("list", newCmdList)
}

// genOptions are the flags shared by generate, check and list.
type genOptions struct {
	Spec    string
	Out     string
	Package string
	Only    string
}

func (o *genOptions) addFlags(cmd *cobra.Command, withOut bool) {
	cmd.Flags().StringVar(&o.Spec, "spec", "spec", "spec file, or a directory holding collgen.yaml")
	if withOut {
		cmd.Flags().StringVar(&o.Out, "out", "generated", "output root: <out>/cuda, <out>/<package>, <out>/MANIFEST")
	}
	cmd.Flags().StringVar(&o.Package, "package", "", "Go package name of the glue (default: the spec's `package`)")
	cmd.Flags().StringVar(&o.Only, "only", "", "only kernels whose names match this glob, e.g. 'allreduce_*_bf16_sum_*'")
}

// render loads the spec and renders the tree in memory.
func (o *genOptions) render() (*gen.Output, error) {
	s, err := spec.Load(o.Spec)
	if err != nil {
		var list spec.ErrorList
		if errors.As(err, &list) {
			return nil, fmt.Errorf("spec has %d error(s); nothing was written:\n%w", len(list), err)
		}
		return nil, err
	}
	return gen.Render(s, gen.Options{Package: o.Package, Only: o.Only})
}

func newCmdGenerate(io *IO) *cobra.Command {
	o := &genOptions{}
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Render CUDA kernels and Go glue from a spec into the output tree",
		Long: `Generate reads a spec (default: the shipped spec/), renders every kernel
combination and the Go glue in memory, and replaces the output tree atomically.
A bad spec writes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := o.render()
			if err != nil {
				return err
			}
			if err := gen.Write(o.Out, out); err != nil {
				return err
			}
			fmt.Fprintf(io.Out, "wrote %d files (%d kernels) to %s\n", len(out.Files), len(out.Plan.Kernels), o.Out)
			return nil
		},
	}
	o.addFlags(cmd, true)
	return cmd
}

func newCmdCheck(io *IO) *cobra.Command {
	o := &genOptions{}
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Exit 1 with a diff when the output tree is stale, hand-edited, or has extra or missing files",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := o.render()
			if err != nil {
				return err
			}
			problems, err := gen.Diff(o.Out, out)
			if err != nil {
				return err
			}
			if len(problems) == 0 {
				fmt.Fprintf(io.Out, "%s is up to date (%d files)\n", o.Out, len(out.Files))
				return nil
			}
			for _, p := range problems {
				fmt.Fprintln(io.Out, p)
			}
			return &ExitError{Code: 1, Err: fmt.Errorf("%s is stale: %d problem(s); run collgen generate", o.Out, len(problems))}
		},
	}
	o.addFlags(cmd, true)
	return cmd
}

func newCmdList(io *IO) *cobra.Command {
	o := &genOptions{}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List every kernel combination: collective, algorithm, dtype, op, world size, kernel name",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := o.render()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "COLLECTIVE\tALGORITHM\tDTYPE\tOP\tWORLD\tKERNEL")
			for _, k := range out.Plan.Kernels {
				op := string(k.Op)
				if op == "" {
					op = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", k.Collective, k.Algorithm, k.DType, op, k.World, k.Name)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(io.Out, "%d kernels", len(out.Plan.Kernels))
			if len(out.Plan.HostReducers) > 0 {
				fmt.Fprintf(io.Out, ", %d host reduce loops", len(out.Plan.HostReducers))
			}
			fmt.Fprintln(io.Out)
			return nil
		},
	}
	o.addFlags(cmd, false)
	return cmd
}
