package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/spec"
	"github.com/collgen/collgen/tune"
)

func init() {
	register("tune", func(io *IO) *cobra.Command { return newCmdTune(io, &tuneOptions{}, nil) })
}

// tuneOptions are `collgen tune`'s flags.
type tuneOptions struct {
	From     []string // bench CSVs (collgen bench --csv), pooled
	Spec     string   // the spec whose topology is tuned
	Topology string   // the topology's name (default: the only one that fits)
	World    int      // for the list form: the world size whose rules to use for all
	Out      string   // write a copy of --spec with the new rules here
	Margin   float64
	Jitter   float64
	Backend  string
	DType    string
	Op       string
	Quiet    bool // leave out the per-size decisions

	Run       bool   // run the sweeps first (collgen bench), then tune from them too
	Worlds    []int  // with --run: the world sizes to sweep (default: the topology's)
	Sweeps    string // with --run: the directory the sweeps' CSVs go to
	BenchArgs string // with --run: more collgen bench flags, e.g. "--sizes 1KiB-64MiB"

	Compare []string // NAME=SPEC rule sets to evaluate on the sweeps instead of tuning
}

// newCmdTune builds `collgen tune`; runF, when not nil, replaces the run.
func newCmdTune(io *IO, o *tuneOptions, runF func(*tuneOptions) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tune (--from CSV... | --run --spec FILE) [--spec FILE [--topology NAME]] [--world N] [--out FILE]",
		Short: "Turn bench sweeps (recorded, or run with --run) into size rules per collective and world size",
		Long: `Tune reads sweeps recorded with collgen bench --csv or --json (every algorithm and
nccl, one or more world sizes; several files are pooled point by point) and
picks, per collective and world size, the algorithm for each measured size:
the incumbent stays while it is within --margin of the fastest, a
challenger must beat it by more than that, near-ties go to NCCL first and
then to the simpler kernel, and one-size flips are merged. It prints the
decisions (close calls flagged: another run may move them by one size) and
the rules as a select block keyed by world size (the per-world syntax of
docs/spec.md).

With --spec, only the algorithms the topology generates are considered
(--topology names it when more than one fits), and --out FILE writes a copy
of --spec, checked with the spec loader, in which the topology's select
gives each tuned collective per world size: the measured world sizes get
their tuned rules, the topology's other world sizes keep the rules they
have. With --world N, the block is printed as one list per collective (for
every world size) from world size N's rules, and --out writes that list.

--run first runs the sweeps with collgen bench (a child process each) at --worlds
(default: the topology's world sizes), writing tune-w<N>.csv files into
--sweeps: on GPUs every collective the topology generates, bf16 sum,
1KiB-256MiB, every algorithm and NCCL; on the host (--backend host) each
collective with --algorithms set to what the topology generates.
--bench-args adds bench flags (they win over these defaults).

--compare NAME=SPEC (repeatable) evaluates rule sets instead of tuning: for
every measured collective, world size and size, what each spec's topology
(--topology, or the only one listing the measured world sizes) picks and
the latency the sweeps measured for that pick, next to the fastest and the
bench's own automatic selection, with a geomean per rule set.`,
		Example: `  collgen bench --backend gpu -n 4 --csv w4.csv && collgen bench --backend gpu -n 2 --csv w2.csv
  collgen tune --from w4.csv --from w2.csv --spec spec --topology nvswitch
  collgen tune --from w4.csv --from w2.csv --spec spec --topology nvswitch --out tuned.yaml
  collgen tune --from w4.csv --spec spec --topology nvswitch --world 4 --out tuned.yaml
  collgen tune --run --spec spec --topology nvswitch --worlds 4,2 --sweeps sweeps
  collgen tune --from w2.csv --topology nvswitch --compare old=old.yaml --compare new=spec`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(o)
			}
			return runTune(io, o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.From, "from", nil, "bench results to tune from: `FILE`s from collgen bench --csv, or --json (*.json); repeat or comma-separate; pooled")
	f.StringVar(&o.Spec, "spec", "", "spec (file or directory) whose topology is tuned")
	f.StringVar(&o.Topology, "topology", "", "topology of --spec to tune (default: the only one that fits the measured world sizes)")
	f.IntVar(&o.World, "world", 0, "use world size `N`'s rules for every world size (one list per collective)")
	f.StringVar(&o.Out, "out", "", "with --spec: write a copy of the spec with the new rules to `FILE` (per world size; with --world, world size N's list)")
	f.Float64Var(&o.Margin, "margin", tune.DefaultMargin, "noise margin: a challenger must be this fraction faster than the incumbent")
	f.Float64Var(&o.Jitter, "jitter", tune.DefaultJitter, "expected run-to-run jitter of one latency, to flag close calls")
	f.StringVar(&o.Backend, "backend", "gpu", "bench backend whose rows to use (gpu, host)")
	f.StringVar(&o.DType, "dtype", "", "only rows of this dtype (default: all, pooled)")
	f.StringVar(&o.Op, "op", "", "only rows of this reduce op (default: all, pooled)")
	f.BoolVarP(&o.Quiet, "quiet", "q", false, "print only the select block")
	f.BoolVar(&o.Run, "run", false, "first run the sweeps with collgen bench (every algorithm the topology generates, and NCCL on GPUs) at --worlds")
	f.IntSliceVar(&o.Worlds, "worlds", nil, "with --run: world sizes to sweep (default: the topology's world sizes)")
	f.StringVar(&o.Sweeps, "sweeps", ".", "with --run: directory for the sweeps' CSVs (tune-w<N>[-<collective>].csv)")
	f.StringVar(&o.BenchArgs, "bench-args", "", "with --run: more collgen bench flags, space separated (e.g. \"--sizes 1KiB-64MiB --iters 20\")")
	f.StringArrayVar(&o.Compare, "compare", nil, "evaluate the rules of spec `NAME=FILE` on the sweeps instead of tuning (repeat to compare)")
	return cmd
}

// runTune reads the sweeps, tunes and prints or writes the rules.
func runTune(io *IO, o *tuneOptions) error {
	switch {
	case o.Backend != "gpu" && o.Backend != "host":
		return usageError(fmt.Errorf("tune: --backend %q: want gpu or host", o.Backend))
	case len(o.From) > 0 && o.Run:
		return usageError(errors.New("tune: --from and --run both give the sweeps; use one (--run writes its CSVs to --sweeps, which --from reads later)"))
	case len(o.From) == 0 && !o.Run:
		return usageError(errors.New("tune: no sweeps; give --from FILE.csv (from collgen bench --csv), or --run to run them"))
	case o.Run && o.Spec == "":
		return usageError(errors.New("tune: --run needs --spec: the topology says which algorithms to sweep"))
	case o.Run && o.Topology == "" && len(o.Worlds) == 0:
		return usageError(errors.New("tune: --run needs --topology NAME or --worlds N,... to know what to sweep"))
	case !(o.Margin > 0 && o.Margin < 1):
		return usageError(fmt.Errorf("tune: --margin %g: want a fraction between 0 and 1, e.g. 0.15", o.Margin))
	case !(o.Jitter > 0 && o.Jitter < 1):
		return usageError(fmt.Errorf("tune: --jitter %g: want a fraction between 0 and 1, e.g. 0.05", o.Jitter))
	case o.World < 0:
		return usageError(fmt.Errorf("tune: --world %d: want a world size of 1 or more", o.World))
	case o.Out != "" && o.Spec == "":
		return usageError(errors.New("tune: --out needs --spec (the spec to copy)"))
	case len(o.Compare) > 0 && (o.Out != "" || o.World != 0):
		return usageError(errors.New("tune: --compare evaluates rules and writes none; leave out --out and --world"))
	}
	var sp *spec.Spec
	var top *spec.Topology
	if o.Spec != "" {
		var err error
		if sp, err = spec.Load(o.Spec); err != nil {
			return fmt.Errorf("tune: --spec %s: %w", o.Spec, err)
		}
	}
	if o.Run {
		var err error
		if top, err = pickTopology(sp, o, o.Worlds); err != nil {
			return err
		}
		worlds := o.Worlds
		if len(worlds) == 0 {
			worlds = top.WorldSizes
		}
		if o.Backend == "gpu" {
			for _, n := range launchNotes(o, sp, top, worlds, collectives.Library) {
				fmt.Fprintf(io.Err, "tune: note: %s\n", n)
			}
		}
		files, err := runSweeps(io, o, top, worlds)
		if err != nil {
			return err
		}
		o.From = append(o.From, files...)
	}
	samples, err := readSweeps(o.From)
	if err != nil {
		return fmt.Errorf("tune: --from: %w", err)
	}
	opts := tune.Options{Margin: o.Margin, Jitter: o.Jitter, Backend: o.Backend, DType: o.DType, Op: o.Op, Host: o.Backend == "host"}
	if len(o.Compare) > 0 {
		return runCompare(io, o, samples, opts)
	}
	if sp != nil {
		if top == nil {
			var err error
			if top, err = pickTopology(sp, o, measuredWorlds(samples, o.Backend)); err != nil {
				return err
			}
		}
		opts.Host = top.Kind == coll.HostSHM
		opts.Allowed = map[string][]string{}
		for c, algs := range top.Generate {
			for _, a := range algs {
				opts.Allowed[string(c)] = append(opts.Allowed[string(c)], string(a))
			}
		}
	}
	tables, err := tune.Crossovers(samples, opts)
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	if top != nil {
		var kept []tune.Table
		for _, t := range tables {
			if slices.Contains(top.WorldSizes, t.World) {
				kept = append(kept, t)
			} else {
				fmt.Fprintf(io.Err, "tune: skipping %s at world size %d: topology %s lists world sizes %v\n", t.Collective, t.World, top.Name, top.WorldSizes)
			}
		}
		if len(kept) == 0 && len(tables) > 0 {
			// An empty select, and an --out "tuned" with nothing changed.
			return usageError(fmt.Errorf("tune: topology %s lists none of the measured world sizes %v (it has %s); nothing to tune",
				top.Name, measuredWorlds(samples, o.Backend), strings.Join(spec.WorldRanges(top.WorldSizes), ",")))
		}
		tables = kept
	}
	if o.World != 0 && !slices.ContainsFunc(tables, func(t tune.Table) bool { return t.World == o.World }) {
		return usageError(fmt.Errorf("tune: --world %d: the sweeps have no rows at world size %d", o.World, o.World))
	}
	if !o.Quiet {
		if err := tune.WriteDecisions(io.Out, tables); err != nil {
			return err
		}
		fmt.Fprintln(io.Out)
		if cc := tune.CloseCalls(tables); len(cc) > 0 {
			fmt.Fprintf(io.Out, "close calls (another run may move these crossovers by one size; pool more sweeps with --from to settle them):\n")
			for _, c := range cc {
				fmt.Fprintf(io.Out, "  %s\n", c)
			}
			fmt.Fprintln(io.Out)
		}
	}
	where := "your topology"
	if top != nil {
		where = "topologies." + top.Name
	}
	if o.World != 0 {
		fmt.Fprintf(io.Out, "# collgen tune (margin %g): world size %d's rules, for %s:\n", o.Margin, o.World, where)
		fmt.Fprint(io.Out, tune.SelectYAMLFor("", tables, o.World))
	} else {
		fmt.Fprintf(io.Out, "# collgen tune (margin %g): rules per world size, for %s\n", o.Margin, where)
		fmt.Fprintf(io.Out, "# (per-world select syntax, docs/spec.md; --world N prints one list per collective):\n")
		fmt.Fprint(io.Out, tune.SelectYAML("", tables))
	}
	if o.Out == "" {
		return nil
	}
	src := sp.Sources[0]
	var out []byte
	if o.World != 0 {
		rules := map[coll.Collective][]spec.Rule{}
		for _, t := range tables {
			if t.World == o.World {
				// SelectByWorld: where select is given per world size,
				// Select lacks the collective, and its symmetric rules.
				c := coll.Collective(t.Collective)
				rules[c] = tune.KeepSymmetric(t.Rules, top.SelectByWorld[c][o.World])
			}
		}
		note := fmt.Sprintf("tuned by collgen tune at world size %d from %s", o.World, strings.Join(o.From, ", "))
		out, err = tune.ReplaceSelect(src.Path, src.Content, top.Name, rules, note)
	} else {
		var ws []int
		for _, t := range tables {
			ws = append(ws, t.World)
		}
		slices.Sort(ws)
		ws = slices.Compact(ws)
		note := fmt.Sprintf("tuned by collgen tune at world sizes %s from %s", strings.ReplaceAll(strings.Trim(fmt.Sprint(ws), "[]"), " ", ", "), strings.Join(o.From, ", "))
		out, err = tune.ReplaceSelectPerWorld(src.Path, src.Content, top.Name, tune.PerWorldRules(top, tables), note)
	}
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	if err := writeFileAtomic(o.Out, out, 0o644); err != nil {
		return fmt.Errorf("tune: --out: %w", err)
	}
	if o.World != 0 {
		fmt.Fprintf(io.Out, "\nwrote %s: topology %s's select from world size %d's rules\n", o.Out, top.Name, o.World)
	} else {
		fmt.Fprintf(io.Out, "\nwrote %s: topology %s's select per world size\n", o.Out, top.Name)
	}
	return nil
}

// readSweeps reads the samples of every sweep file: collgen bench's JSON
// (.json) or CSV.
func readSweeps(paths []string) ([]tune.Sample, error) {
	var samples []tune.Sample
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--from: %w", err)
		}
		var s []tune.Sample
		if strings.HasSuffix(path, ".json") {
			var rs []bench.Result
			if rs, err = bench.ReadJSON(f); err == nil {
				s, err = tune.FromResults(rs, path)
			} else {
				err = fmt.Errorf("%s: %w", path, err)
			}
		} else {
			s, err = tune.ReadCSV(f, path)
		}
		f.Close()
		if err != nil {
			return nil, err
		}
		samples = append(samples, s...)
	}
	return samples, nil
}

// pickTopology returns the topology to tune: --topology, or the only one
// of the backend's kind (GPU or host) that lists every world size in ws.
func pickTopology(s *spec.Spec, o *tuneOptions, ws []int) (*spec.Topology, error) {
	if o.Topology != "" {
		t := s.Topology(o.Topology)
		if t == nil {
			var names []string
			for _, t := range s.Topologies {
				names = append(names, t.Name)
			}
			return nil, usageError(fmt.Errorf("tune: --topology %q: no such topology in %s (has: %s)", o.Topology, o.Spec, strings.Join(names, ", ")))
		}
		if host := t.Kind == coll.HostSHM; host != (o.Backend == "host") {
			want, match := "GPU", "gpu" // the kind the sweeps fit, the backend the topology fits
			if o.Backend == "host" {
				want = "host"
			}
			if host {
				match = "host"
			}
			return nil, usageError(fmt.Errorf("tune: --topology %s is %s, but the sweeps are --backend %s's; tune a %s topology, or pass --backend %s", t.Name, t.Kind, o.Backend, want, match))
		}
		return t, nil
	}
	var fits []*spec.Topology
	var names []string
	for i := range s.Topologies {
		t := &s.Topologies[i]
		if (t.Kind == coll.HostSHM) != (o.Backend == "host") {
			continue
		}
		ok := true
		for _, w := range ws {
			ok = ok && slices.Contains(t.WorldSizes, w)
		}
		if ok {
			fits = append(fits, t)
			names = append(names, t.Name)
		}
	}
	switch len(fits) {
	case 0:
		return nil, usageError(fmt.Errorf("tune: no %s topology of %s lists every measured world size %v; name one with --topology (its other world sizes are skipped)", o.Backend, o.Spec, ws))
	case 1:
		return fits[0], nil
	}
	return nil, usageError(fmt.Errorf("tune: topologies %s of %s all list the measured world sizes %v; name one with --topology", strings.Join(names, ", "), o.Spec, ws))
}

// launchNotes names each algorithm the sweeps time whose launch parameters
// in sp differ from the kernels collgen bench runs (lib, this binary's
// built-in library, from collgen's own spec): the rules measured then hold
// for those kernels, not exactly for the ones sp generates.
func launchNotes(o *tuneOptions, sp *spec.Spec, top *spec.Topology, worlds []int, lib *kernels.Library) []string {
	var notes []string
	for _, c := range coll.Collectives() {
		for _, a := range top.Generate[c] {
			want := sp.Launch(c, a)
			for _, w := range worlds {
				k, ok := lib.AlgorithmKernel(c, a, w)
				if !ok {
					continue
				}
				got := k.Launch
				if got.Threads != want.Threads || got.MaxBlocks != want.MaxBlocks || got.VectorBytes != want.VectorBytes || got.MinThreads != want.MinThreads {
					notes = append(notes, fmt.Sprintf("collgen bench times its built-in kernels (collgen's own spec), and its %s %s launches %s where --spec %s has %s: the sweeps measure those launch parameters; to keep the measured rules exact, use the same ones in the spec, or time your own package with bench/gpubench (Config.Library)",
						c, a, launchString(got.Threads, got.MaxBlocks, got.VectorBytes, got.MinThreads), o.Spec, launchString(want.Threads, want.MaxBlocks, want.VectorBytes, want.MinThreads)))
				}
				break
			}
		}
	}
	return notes
}

func launchString(threads, maxBlocks, vectorBytes, minThreads int) string {
	s := fmt.Sprintf("{threads: %d, max_blocks: %d, vector_bytes: %d", threads, maxBlocks, vectorBytes)
	if minThreads != 0 {
		s += fmt.Sprintf(", min_threads: %d", minThreads)
	}
	return s + "}"
}

// runSweeps runs collgen bench, as a child process of this program (so a
// sweep's CUDA and NCCL state ends with it), for every world size: on
// GPUs once per world size over every collective the topology generates
// (the GPU bench times every algorithm, NCCL and auto), on the host once
// per collective with --algorithms set to what the topology generates.
// Bench's tables go to stderr; the CSVs' paths come back.
func runSweeps(io *IO, o *tuneOptions, top *spec.Topology, worlds []int) ([]string, error) {
	if err := os.MkdirAll(o.Sweeps, 0o755); err != nil {
		return nil, err
	}
	var colls []string
	for _, c := range coll.Collectives() {
		if len(top.Generate[c]) > 0 {
			colls = append(colls, string(c))
		}
	}
	if len(colls) == 0 {
		return nil, fmt.Errorf("tune: topology %s generates nothing to sweep", top.Name)
	}
	extra := strings.Fields(o.BenchArgs)
	exe, err := selfExe()
	if err != nil {
		return nil, fmt.Errorf("tune: cannot find this program to run collgen bench: %w", err)
	}
	var files []string
	run := func(w int, file string, args ...string) error {
		args = append(append([]string{"bench", "--backend", o.Backend, "-n", fmt.Sprint(w), "--csv", file}, args...), extra...)
		fmt.Fprintf(io.Err, "tune: collgen %s\n", strings.Join(args, " "))
		cmd := exec.Command(exe, args...)
		cmd.Stdout, cmd.Stderr = io.Err, io.Err
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("tune: the sweep at world size %d failed (collgen bench: %v; its output is above)", w, err)
		}
		files = append(files, file)
		return nil
	}
	for _, w := range worlds {
		if !slices.Contains(top.WorldSizes, w) {
			return nil, usageError(fmt.Errorf("tune: --worlds %d: topology %s lists world sizes %v", w, top.Name, top.WorldSizes))
		}
		if o.Backend != "host" {
			file := filepath.Join(o.Sweeps, fmt.Sprintf("tune-w%d.csv", w))
			if err := run(w, file, "--collective", strings.Join(colls, ","), "--dtype", "bf16", "--op", "sum", "--sizes", "1KiB-256MiB"); err != nil {
				return nil, err
			}
			continue
		}
		for _, c := range colls {
			var algs []string
			for _, a := range top.Generate[coll.Collective(c)] {
				algs = append(algs, string(a))
			}
			file := filepath.Join(o.Sweeps, fmt.Sprintf("tune-w%d-%s.csv", w, c))
			if err := run(w, file, "--collective", c, "--algorithms", strings.Join(algs, ",")); err != nil {
				return nil, err
			}
		}
	}
	return files, nil
}
