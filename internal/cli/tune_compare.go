package cli

import (
	"fmt"
	"slices"
	"strings"

	"github.com/collgen/collgen/spec"
	"github.com/collgen/collgen/tune"
)

// runCompare evaluates the --compare rule sets on the sweeps' samples.
func runCompare(io *IO, o *tuneOptions, samples []tune.Sample, opts tune.Options) error {
	worlds := measuredWorlds(samples, o.Backend)
	var sets []tune.RuleSet
	var names []string
	for _, arg := range o.Compare {
		name, file, ok := strings.Cut(arg, "=")
		if !ok {
			name, file = arg, arg
		}
		if name == "" || file == "" {
			return usageError(fmt.Errorf("tune: --compare %q: want NAME=SPEC, e.g. tuned=spec/collgen.yaml", arg))
		}
		sp, err := spec.Load(file)
		if err != nil {
			return fmt.Errorf("tune: --compare %s: %w", arg, err)
		}
		so := *o
		so.Spec = file
		top, err := pickTopology(sp, &so, worlds)
		if err != nil {
			return err
		}
		sets = append(sets, tune.TopologyRules(name, top))
		names = append(names, name)
	}
	cs, err := tune.Compare(samples, opts, sets)
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	return tune.WriteComparisons(io.Out, names, cs, opts.Margin)
}

// measuredWorlds returns the world sizes the backend's samples cover,
// ascending.
func measuredWorlds(samples []tune.Sample, backend string) []int {
	var ws []int
	for _, x := range samples {
		if (x.Backend == "" || x.Backend == backend) && !slices.Contains(ws, x.World) {
			ws = append(ws, x.World)
		}
	}
	slices.Sort(ws)
	return ws
}
