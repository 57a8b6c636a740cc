package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
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
	writes  bool // generate: errors say nothing was written
}

func (o *genOptions) addFlags(cmd *cobra.Command, withOut bool) {
	cmd.Flags().StringVar(&o.Spec, "spec", "", "spec file, or a directory holding collgen.yaml (default ./collgen.yaml, else ./spec/collgen.yaml)")
	if withOut {
		cmd.Flags().StringVar(&o.Out, "out", "generated", "output root: <out>/cuda, <out>/<package>, <out>/MANIFEST")
	}
	cmd.Flags().StringVar(&o.Package, "package", "", "Go package name of the glue (default: the spec's `package`)")
	cmd.Flags().StringVar(&o.Only, "only", "", "only kernels whose names match this glob, e.g. 'allreduce_*_bf16_sum_*'")
}

// defaultSpecs are where --spec looks when not given: a user's project
// (collgen init writes collgen.yaml), then this repository's layout.
var defaultSpecs = []string{spec.DefaultFile, filepath.Join("spec", spec.DefaultFile)}

// specPath returns --spec, or the first of defaultSpecs that exists.
func (o *genOptions) specPath() (string, error) {
	if o.Spec != "" {
		return o.Spec, nil
	}
	for _, p := range defaultSpecs {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", usageError(fmt.Errorf("no spec here: neither %s exists; name one with --spec FILE, or write a starter with collgen init", strings.Join(defaultSpecs, " nor ")))
}

// render loads the spec and renders the tree in memory.
func (o *genOptions) render() (*gen.Output, error) {
	// A malformed glob is a bad flag value (exit 2), as in fatbin.
	if _, err := path.Match(o.Only, ""); err != nil {
		return nil, usageError(fmt.Errorf("--only %q: %w", o.Only, err))
	}
	file, err := o.specPath()
	if err != nil {
		return nil, err
	}
	s, err := spec.Load(file)
	if err != nil {
		var list spec.ErrorList
		if errors.As(err, &list) {
			written := ""
			if o.writes {
				written = "; nothing was written"
			}
			return nil, fmt.Errorf("spec has %d error(s)%s:\n%w", len(list), written, err)
		}
		return nil, err
	}
	imp := "example.com/collgen-list" // list writes no tree: any import path does
	if o.Out != "" {
		if imp, err = gen.ImportPath(o.Out); err != nil {
			return nil, err
		}
	}
	out, err := gen.Render(s, gen.Options{Package: o.Package, Only: o.Only, ImportPath: imp})
	var bad *spec.PackageError
	if errors.As(err, &bad) {
		return nil, usageError(err) // --package (the spec's own was checked at load)
	}
	if err != nil {
		return nil, err
	}
	if o.Only != "" && len(out.Plan.Kernels) == 0 {
		return nil, &NoMatchError{Pattern: o.Only}
	}
	return out, nil
}

// NoMatchError is returned when an --only pattern matches no kernel: an
// empty tree is never what was meant.
type NoMatchError struct {
	Pattern string // the --only pattern, as given
}

// Error says the pattern matched nothing and how to see the names.
func (e *NoMatchError) Error() string {
	return fmt.Sprintf("--only %q matches no kernel; `collgen list` shows the names (e.g. allreduce_oneshot_bf16_sum_w4), and * matches any run of characters", e.Pattern)
}

// ForeignDirError is returned by generate when --out names something
// collgen did not make: a non-empty directory without a collgen MANIFEST,
// a collgen tree holding files the MANIFEST does not list, at any depth (a
// .git, a helper added to the generated package), or a file. generate replaces its output
// directory wholesale, so it refuses rather than delete someone's work.
type ForeignDirError struct {
	// Dir is the --out directory.
	Dir string
	// Entries are some of the entries that show it is not collgen's.
	Entries []string
	// Reason says which check failed.
	Reason string
}

// Error names the directory, why it is refused and what to do instead.
func (e *ForeignDirError) Error() string {
	return fmt.Sprintf("refusing to write into %s: %s (%s); collgen replaces its output directory as a whole, so give --out a new or empty directory, or one collgen generated",
		e.Dir, e.Reason, strings.Join(e.Entries, ", "))
}

// checkOutDir refuses an output directory that collgen did not make: see
// ForeignDirError. A missing or empty directory is fine. A file the
// MANIFEST does not list but that holds exactly what out renders at its
// path is collgen's (a MANIFEST damaged by a bad merge), not foreign.
func checkOutDir(dir string, out *gen.Output) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &ForeignDirError{Dir: dir, Entries: []string{fileKind(fi)}, Reason: "it is not a directory"}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(ents) == 0 {
		return nil
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	sample := func(n []string) []string {
		if len(n) > 5 {
			return append(slices.Clone(n[:5]), fmt.Sprintf("and %d more", len(n)-5))
		}
		return n
	}
	listed, ok := gen.ReadManifestFiles(filepath.Join(dir, gen.ManifestName))
	if !ok {
		return &ForeignDirError{Dir: dir, Entries: sample(names), Reason: "it is not empty and has no collgen MANIFEST"}
	}
	// Every file must be one the MANIFEST lists, at any depth: a helper
	// added to the generated package, or a note in cuda/, is someone's
	// work. A directory holding no listed file is named as a whole.
	under := map[string]bool{}
	for p := range listed {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			under[d] = true
		}
	}
	for p := range out.Files {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			under[d] = true
		}
	}
	var foreign []string
	err = filepath.WalkDir(dir, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, full)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir() && !under[rel]:
			foreign = append(foreign, rel)
			return fs.SkipDir
		case !d.IsDir() && rel != gen.ManifestName && !listed[rel] && !rendered(out, rel, full):
			foreign = append(foreign, rel)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(foreign) > 0 {
		return &ForeignDirError{Dir: dir, Entries: sample(foreign), Reason: "it holds entries its collgen MANIFEST does not list"}
	}
	return nil
}

// rendered reports whether the file at full holds exactly what out renders
// at rel.
func rendered(out *gen.Output, rel, full string) bool {
	want, ok := out.Files[rel]
	if !ok {
		return false
	}
	got, err := os.ReadFile(full)
	return err == nil && bytes.Equal(got, want)
}

// fileKind names what a non-directory is, for ForeignDirError.
func fileKind(fi os.FileInfo) string {
	switch t := fi.Mode().Type(); {
	case t == 0:
		return "a file"
	case t&os.ModeSymlink != 0:
		return "a symbolic link"
	default:
		return "a " + t.String() + " entry"
	}
}

func newCmdGenerate(io *IO) *cobra.Command {
	o := &genOptions{writes: true}
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Render CUDA kernels and Go glue from a spec into the output tree",
		Long: `Generate reads a spec (default: ./collgen.yaml, else ./spec/collgen.yaml),
renders every kernel combination and the Go glue in memory, and replaces the
output tree atomically. A bad spec writes nothing. The output directory
belongs to collgen: generate refuses a non-empty one that has no collgen
MANIFEST, or that holds files the MANIFEST does not list at any depth (a
.git, a helper added to the generated package), and it must sit inside a Go
module (the generated package imports <out>/cuda by its module path). An
--only pattern that matches no kernel is an error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Out == "" {
				return usageError(errors.New("generate: --out is empty; name the output directory"))
			}
			if fi, err := os.Lstat(o.Out); err == nil && !fi.IsDir() {
				return fmt.Errorf("generate: %w", &ForeignDirError{Dir: o.Out, Entries: []string{fileKind(fi)}, Reason: "it is not a directory"})
			}
			out, err := o.render()
			if err != nil {
				return err
			}
			if err := checkOutDir(o.Out, out); err != nil {
				return fmt.Errorf("generate: %w", err)
			}
			if err := gen.Write(o.Out, out); err != nil {
				return err
			}
			fmt.Fprintf(io.Out, "wrote %d files (%d kernels in %d programs) to %s\n", len(out.Files), len(out.Plan.Kernels), len(out.Plan.Programs), o.Out)
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
		Long: `Check renders the spec in memory exactly as generate would and compares the
result with the tree on disk: give it the same --spec, --out, --package and
--only as the generate that wrote the tree (--out defaults to ./generated).
It writes nothing; on a difference it prints a diff per file and exits 1,
naming the generate command that brings the tree up to date. Run it in CI.`,
		Example: "  collgen check --spec collgen.yaml --out internal/gen",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Out == "" {
				return usageError(errors.New("check: --out is empty; name the output directory"))
			}
			if fi, err := os.Lstat(o.Out); err == nil && !fi.IsDir() {
				// generate refuses it (ForeignDirError): say so, rather
				// than compare a link or file with the tree.
				return fmt.Errorf("check: %s is %s, not a directory: collgen generate refuses it (it replaces its output directory as a whole); give --out the directory itself", o.Out, fileKind(fi))
			}
			out, err := o.render()
			if err != nil {
				return err
			}
			regen := o.regenerateCommand(cmd)
			if _, err := os.Stat(o.Out); errors.Is(err, fs.ErrNotExist) {
				return &ExitError{Code: 1, Err: fmt.Errorf("%s does not exist: generate it with %s, or name the directory you generate into with --out", o.Out, regen)}
			}
			problems, err := gen.Diff(o.Out, out)
			if err != nil {
				return err
			}
			for _, l := range gen.Leftovers(o.Out) {
				fmt.Fprintf(io.Err, "collgen check: note: %s was left by an interrupted collgen generate; the next generate removes it once a minute old (or remove it)\n", l)
			}
			if len(problems) == 0 {
				fmt.Fprintf(io.Out, "%s is up to date (%d files)\n", o.Out, len(out.Files))
				return nil
			}
			for _, p := range problems {
				fmt.Fprintln(io.Out, p)
			}
			return &ExitError{Code: 1, Err: fmt.Errorf("%s is stale: %d problem(s)%s; run %s", o.Out, len(problems), flagHint(o.Out, out), regen)}
		},
	}
	o.addFlags(cmd, true)
	return cmd
}

// regenerateCommand is the collgen generate command that rewrites the tree
// check compared: the same --spec, --out, --package and --only as given
// (a bare "collgen generate" would write ./generated from the default spec).
func (o *genOptions) regenerateCommand(cmd *cobra.Command) string {
	args := []string{"collgen generate"}
	for _, f := range []struct{ name, v string }{{"spec", o.Spec}, {"out", o.Out}, {"package", o.Package}, {"only", o.Only}} {
		if cmd.Flags().Changed(f.name) {
			args = append(args, "--"+f.name, shellQuote(f.v))
		}
	}
	return strings.Join(args, " ")
}

// flagHint says when the tree on disk was generated with another --only or
// --package than check rendered (its MANIFEST records both): then every
// difference may be that, not an edit or a spec change.
func flagHint(dir string, out *gen.Output) string {
	disk, err := os.ReadFile(filepath.Join(dir, gen.ManifestName))
	if err != nil {
		return ""
	}
	recorded := func(manifest, key string) string {
		for _, l := range strings.Split(manifest, "\n") {
			if v, ok := strings.CutPrefix(l, key+" "); ok {
				return v
			}
		}
		return ""
	}
	var hints []string
	for _, key := range []string{"only", "package"} {
		was, now := recorded(string(disk), key), recorded(string(out.Files[gen.ManifestName]), key)
		switch {
		case was == now:
		case was == "":
			hints = append(hints, fmt.Sprintf("without --%s", key))
		default:
			hints = append(hints, fmt.Sprintf("with --%s %s", key, shellQuote(was)))
		}
	}
	if len(hints) == 0 {
		return ""
	}
	return fmt.Sprintf(" (the tree was generated %s: give check the flags generate had)", strings.Join(hints, " and "))
}

// shellQuote quotes s for a POSIX shell when it holds anything but plain
// path characters.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
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
			fmt.Fprintln(tw, "COLLECTIVE\tALGORITHM\tDTYPE\tOP\tWORLD\tKERNEL\tPROGRAM")
			for _, k := range out.Plan.Kernels {
				op := string(k.Op)
				if op == "" {
					op = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", k.Collective, k.Algorithm, k.DType, op, k.World, k.Name, k.Program.Name)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(io.Out, "%d kernels in %d programs", len(out.Plan.Kernels), len(out.Plan.Programs))
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
