// Package cli holds collgen's cobra commands. Each command lives in its own
// file and registers its constructor with register from an init function, so
// commands can be added without touching this file.
package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"
)

// IO is the streams a command reads and writes; tests pass buffers.
type IO struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
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
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// NewRoot builds the collgen command tree writing to the given streams.
func NewRoot(io *IO) *cobra.Command {
	root := &cobra.Command{
		Use:           "collgen",
		Short:         "Generate, check, run and benchmark specialised GPU collective kernels",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
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
	return root
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
	return 1
}
