package cli

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/spec"
)

func init() { register("init", newCmdInit) }

// starterSpec is the commented spec `collgen init` writes; {{PACKAGE}}
// stands for the Go package name, {{SPEC}} for the spec's path in the
// commands its header gives.
//
//go:embed starter.yaml
var starterSpec string

// StarterSpec returns the starter spec for Go package pkg, as `collgen
// init` writes it.
func StarterSpec(pkg string) []byte {
	return starterSpecAt(pkg, spec.DefaultFile)
}

// starterSpecAt returns the starter spec for Go package pkg written to
// path: the commands in its header name path, as init's "next:" line does
// (collgen.yaml for a path with a line break, which would end the comment).
func starterSpecAt(pkg, path string) []byte {
	if strings.ContainsAny(path, "\r\n") {
		path = spec.DefaultFile
	}
	r := strings.NewReplacer("{{PACKAGE}}", pkg, "{{SPEC}}", shellWord(filepath.ToSlash(path)))
	return []byte(r.Replace(starterSpec))
}

// shellWord returns s as one word of a POSIX shell command line: as it is
// when it holds only characters no shell treats specially, else in single
// quotes.
func shellWord(s string) string {
	plain := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./+,:@%=", r))
	}) < 0
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func newCmdInit(io *IO) *cobra.Command {
	var pkg string
	cmd := &cobra.Command{
		Use:   "init [FILE|DIR]",
		Short: "Write a starter spec (commented, valid) into your project",
		Long: `Init writes a starter spec to FILE (default collgen.yaml; DIR/collgen.yaml
for a directory, which --spec takes alike): all-reduce,
reduce-scatter and all-gather kernels for f32 and bf16 on NVLink-connected
GPUs (size rules falling back to NCCL) and for CPU ranks over shared memory
(to try it without a GPU), with comments saying what each
field does. It never overwrites an existing file. Then generate the package:

  collgen generate --spec collgen.yaml --out internal/gen --package collectives`,
		Example: `  collgen init
  collgen init --package mycoll specs/collgen.yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := spec.DefaultFile
			if len(args) == 1 {
				path = args[0]
				// A directory, as --spec takes one: the spec goes inside.
				if fi, err := os.Stat(path); err == nil && fi.IsDir() || strings.HasSuffix(path, "/") || strings.HasSuffix(path, string(filepath.Separator)) {
					path = filepath.Join(path, spec.DefaultFile)
				}
			}
			if err := spec.CheckPackage(pkg); err != nil {
				return usageError(fmt.Errorf("init: --package: %w", err))
			}
			data := starterSpecAt(pkg, path)
			// The starter must always be a spec collgen accepts.
			if _, err := spec.Parse(path, data); err != nil {
				return fmt.Errorf("init: the starter spec is invalid (a collgen bug): %w", err)
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return fmt.Errorf("init: %w", err)
			}
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("init: %s already exists; not overwriting it (remove it, or name another file: collgen init FILE)", path)
			}
			if err != nil {
				return fmt.Errorf("init: %w", err)
			}
			if _, err := f.Write(data); err != nil {
				f.Close()
				os.Remove(path)
				return fmt.Errorf("init: %w", err)
			}
			if err := f.Close(); err != nil {
				os.Remove(path)
				return fmt.Errorf("init: %w", err)
			}
			fmt.Fprintf(io.Out, "wrote %s; next:\n  collgen generate --spec %s --out internal/gen --package %s\n", path, shellWord(filepath.ToSlash(path)), pkg)
			return nil
		},
	}
	cmd.Flags().StringVar(&pkg, "package", "collectives", "Go package name of the generated glue")
	return cmd
}
