// Package cli holds collgen's cobra commands. Each command lives in its own
// file and registers its constructor with register from an init function, so
// commands can be added without touching this file.
package cli

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/runtime/kernels"
)

// IO is the streams a command reads and writes; tests pass buffers.
type IO struct {
	In  io.Reader // standard input
	Out io.Writer // results: tables, generated listings
	Err io.Writer // progress, notes and errors
}

// constructors holds every registered command constructor, by name.
var constructors = map[string]func(*IO) *cobra.Command{}

// register adds a command constructor; called from init functions.
func register(name string, newCmd func(*IO) *cobra.Command) {
	constructors[name] = newCmd
}

// ExitError carries a specific exit code out of a command (for example the
// failing rank's code from `collgen run`, or 1 from a stale `collgen check`).
type ExitError struct {
	Code int   // the process's exit status
	Err  error // what failed; nil: nothing more to print than the status
}

// Error returns the wrapped error's message, or the exit status.
func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

// Unwrap returns the wrapped error.
func (e *ExitError) Unwrap() error { return e.Err }

// NewRoot builds the collgen command tree writing to the given streams.
func NewRoot(io *IO) *cobra.Command {
	root := &cobra.Command{
		Use:           "collgen",
		Short:         "Generate, check, run and benchmark specialised GPU collective kernels",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	root.SetVersionTemplate("collgen {{.Version}}\n")
	root.SetIn(io.In)
	root.SetOut(io.Out)
	root.SetErr(io.Err)
	names := make([]string, 0, len(constructors))
	for name := range constructors {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		root.AddCommand(constructors[name](io))
	}
	markUsage(root)
	return root
}

// markUsage makes the errors of using a command wrongly exit 2 like every
// other usage error: flags cobra cannot parse, arguments the command does
// not take. (An unknown command is Do's to spot: cobra reports it from the
// root's own argument check, which has no hook.)
func markUsage(c *cobra.Command) {
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return usageError(err)
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markUsage(sub)
	}
}

// Do runs collgen with args and returns the process exit code: 0 on success,
// the code of an *ExitError, 2 for usage errors and 1 for any other error.
func Do(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	io := &IO{In: stdin, Out: stdout, Err: stderr}
	root := NewRoot(io)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintln(stderr, "collgen:", ee.Err)
		}
		return ee.Code
	}
	fmt.Fprintln(stderr, "collgen:", err)
	if strings.HasPrefix(err.Error(), "unknown command ") {
		return 2
	}
	return 1
}

// version describes this build for --version: the module version (or
// "(devel)" for a checkout), the commit when the go command recorded one,
// and the generated-code contract (kernels.GenVersion: a generated package
// builds against runtimes that read its version).
func version() string {
	v := "(devel)"
	var rev, dirty string
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && len(s.Value) >= 12:
				rev = " commit " + s.Value[:12]
			case s.Key == "vcs.modified" && s.Value == "true":
				dirty = " (modified)"
			}
		}
	}
	return fmt.Sprintf("%s%s%s, generates code version %d (this runtime reads %d..%d), %s", v, rev, dirty,
		kernels.GenVersion, kernels.MinVersion, kernels.MaxVersion, runtime.Version())
}
