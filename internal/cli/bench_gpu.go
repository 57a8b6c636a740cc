package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/bench/gpubench"
	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/spec"
)

// The GPU bench: bench/gpubench's sweep behind `collgen bench --backend
// gpu`. bench.go owns the command and every flag (the GPU-only ones are in
// BenchOptions.gpu); this file sets its gpuBench hook and documents the GPU
// mode in the command's help.
func init() {
	gpuBench = runGPUBench
	benchHelp = append(benchHelp, addGPUBenchHelp)
}

// addGPUBenchHelp extends the bench command's help with the GPU mode.
func addGPUBenchHelp(cmd *cobra.Command) {
	cmd.Long += `

--backend gpu measures on this host's GPUs, one goroutine per GPU (or, with
--processes, one process per GPU; or run "collgen run -n N -- collgen bench
--backend gpu --worker ..."). For every size it times each generated
algorithm forced, the automatic selection ("auto") and NCCL, all in the same
run: K=20 back-to-back collectives captured in a CUDA graph (--eager: launched
one by one), replayed until about 20 ms (or --iters times), median per-op
latency of rank 0's replays (timed with CUDA events on its stream); the ratio column is NCCL's latency over the row's. Default sizes
1KiB-256MiB; default algorithms: all of them. See docs/performance.md.`
	cmd.Example += `
  collgen bench --backend gpu -n 4 --dtype bf16 --op sum --sizes 1KiB-256MiB --check --json ar.json --png ar.png
  collgen bench --backend gpu -n 2 --collective reduce_scatter,allgather --dtype bf16 --algorithms auto,nccl`
}

// gpuSweep is one (collective, dtype, op) sweep of a GPU bench.
type gpuSweep struct {
	cfg  gpubench.Config
	plan *gpubench.Plan
}

// gpuSweeps expands the options into sweeps (all-gather ignores --op).
func gpuSweeps(o *BenchOptions, g *gpuBenchFlags) ([]gpuSweep, error) {
	sizes := o.Sizes
	if !g.sizesSet {
		var err error
		if sizes, err = bench.ParseSizes(gpubench.DefaultSizes); err != nil {
			return nil, err
		}
	}
	var staging int64
	if g.staging != "" {
		var err error
		if staging, err = spec.ParseSize(g.staging); err != nil || staging <= 0 {
			return nil, usageError(fmt.Errorf("bench: --staging %q: want a positive size such as 256MiB", g.staging))
		}
	}
	if g.maxBlocks < 0 {
		return nil, usageError(fmt.Errorf("bench: --max-blocks %d: want a positive block count, or 0 for each kernel's spec max_blocks", g.maxBlocks))
	}
	awkward := bench.AwkwardNone
	if g.awkward != "" {
		var err error
		if awkward, err = bench.ParseAwkward(g.awkward); err != nil {
			return nil, usageError(fmt.Errorf("bench: --%w", err))
		}
	}
	var devices []int
	if g.devices != "" {
		for _, s := range strings.Split(g.devices, ",") { // not splitList: a GPU may hold several ranks
			d, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || d < 0 {
				return nil, usageError(fmt.Errorf("bench: --devices %q: want CUDA ordinals such as 0,1,2,3", g.devices))
			}
			devices = append(devices, d)
		}
		if len(devices) != o.World {
			return nil, usageError(fmt.Errorf("bench: --devices names %d GPUs for -n %d; name one per rank", len(devices), o.World))
		}
	}
	var timeout time.Duration
	if g.timeoutSet {
		timeout = o.Timeout
	}
	var out []gpuSweep
	seen := map[string]bool{}
	for _, c := range o.Collectives {
		for _, dt := range o.DTypes {
			for _, op := range o.Ops {
				if c == string(coll.AllGather) {
					op = ""
				}
				key := c + "/" + dt + "/" + op
				if seen[key] {
					continue
				}
				seen[key] = true
				cfg := gpubench.Config{Library: collectives.Library, WorldSize: o.World, Devices: devices, Collective: coll.Collective(c),
					DType: coll.DType(dt), Op: coll.Op(op), Sizes: sizes, Algorithms: o.Algorithms, Eager: g.eager, Check: o.Check,
					ZeroCopy: g.zeroCopy, Awkward: awkward, Replays: o.Iters, StagingBytes: staging, Timeout: timeout,
					NoEarlyLaunch: g.noEarlyLaunch, MaxBlocks: g.maxBlocks, NCCLNonBlocking: g.ncclNonBlock}
				plan, err := gpubench.NewPlan(cfg)
				if err != nil {
					return nil, usageError(fmt.Errorf("bench: %w", err))
				}
				out = append(out, gpuSweep{cfg: cfg, plan: plan})
			}
		}
	}
	return out, nil
}

func runGPUBench(io *IO, o *BenchOptions) error {
	ctx, stop := interruptContext()
	defer stop()
	g := &o.gpu
	if o.worker {
		// The launcher decides the world size.
		env, err := rendezvous.ReadEnv()
		if err != nil {
			return fmt.Errorf("bench worker: %w", err)
		}
		o.World = env.WorldSize
	}
	sweeps, err := gpuSweeps(o, g)
	if err != nil {
		return err
	}
	if o.worker {
		return runGPUWorker(ctx, io, o, sweeps)
	}
	total := 0
	for _, s := range sweeps {
		total += len(s.plan.Shapes) * len(s.plan.Variants)
	}
	prog := bench.NewProgress(io.Err, total, o.Progress)
	// Without a bar (logs), each measurement gets a line as it finishes.
	lines := !o.Progress && !bench.IsTerminal(io.Err)
	var (
		ms   []gpubench.Measurement
		logs bytes.Buffer
	)
	if g.processes {
		ms, err = benchGPUProcesses(ctx, io, o, g, prog, &logs)
	} else {
		for _, s := range sweeps {
			s.cfg.Log = &logs
			s.cfg.Progress = func(_, _ int, m *gpubench.Measurement) {
				prog.Step(progressLabel(m))
				if lines {
					fmt.Fprintln(io.Err, measurementLine(m))
				}
			}
			var got []gpubench.Measurement
			got, err = gpubench.Run(ctx, s.cfg)
			ms = append(ms, got...)
			if err != nil {
				break
			}
		}
	}
	prog.Finish()
	io.Err.Write(logs.Bytes())
	if se, ok := context.Cause(ctx).(signalError); ok {
		// What was measured before the signal is reported; the exit
		// status is the signal's, as the host bench's.
		rerr := reportGPU(io, o, ms, awkwardNote(sweeps), nil)
		return &ExitError{Code: se.exitCode(), Err: errors.Join(fmt.Errorf("bench: %w; stopped all ranks", se), rerr)}
	}
	return reportGPU(io, o, ms, awkwardNote(sweeps), err)
}

// measurementLine is one finished measurement, for logs.
func measurementLine(m *gpubench.Measurement) string {
	s := "bench: " + progressLabel(m)
	switch {
	case m.Skipped != "":
		return s + ": skipped: " + m.Skipped
	case m.Error != "":
		return s + ": FAILED: " + m.Error
	}
	s += fmt.Sprintf(": %.2f us (min %.2f, max %.2f, %d replays)", m.LatencyUS, m.MinUS, m.MaxUS, m.Replays)
	if m.Check != "" {
		s += ", check " + m.Check
	}
	return s
}

func progressLabel(m *gpubench.Measurement) string {
	return fmt.Sprintf("%s %s %s %s", m.Collective, m.DType, gpubench.FormatSize(m.Bytes), m.Variant)
}

// reportGPU prints the shared table (and files), then the side-by-side
// summary, then any failure loudly; failures make the exit status 1.
func reportGPU(io *IO, o *BenchOptions, ms []gpubench.Measurement, awkwardText string, runErr error) error {
	results := gpuResults(ms)
	if len(results) > 0 {
		if err := report(io, o, results); err != nil {
			return errors.Join(runErr, err)
		}
		if o.JSON != "-" {
			fmt.Fprintln(io.Out)
			writeGPUSummary(io.Out, ms, awkwardText)
		}
	}
	var bad []string
	for _, m := range ms {
		if m.CheckFailed() {
			bad = append(bad, fmt.Sprintf("CHECK FAILED: %s %s %s %s world %d: %s", m.Collective, m.DType, gpubench.FormatSize(m.Bytes), m.Variant, m.World, m.Check))
		}
		if m.Error != "" {
			bad = append(bad, fmt.Sprintf("FAILED: %s %s %s %s world %d: %s", m.Collective, m.DType, gpubench.FormatSize(m.Bytes), m.Variant, m.World, m.Error))
		}
	}
	for _, b := range bad {
		fmt.Fprintln(io.Err, b)
	}
	switch {
	case runErr != nil:
		return fmt.Errorf("bench: %w", runErr)
	case len(bad) > 0:
		return &ExitError{Code: 1, Err: fmt.Errorf("bench: %d measurement(s) failed or gave wrong results (listed above)", len(bad))}
	}
	return nil
}

// gpuResults converts measured rows to the shared bench.Result. A row whose
// --check failed is left out: a Result has no check column, and in the
// JSON and CSV (what collgen tune reads) its time would stand for a kernel
// that computes the collective (the summary marks it "!", and the bench
// fails).
func gpuResults(ms []gpubench.Measurement) []bench.Result {
	var out []bench.Result
	for _, m := range ms {
		if !m.Measured() || m.CheckFailed() {
			continue
		}
		backend := "gpu"
		if m.Mode == "eager" {
			backend = "gpu-eager"
		}
		r := bench.Result{Backend: backend, Collective: string(m.Collective), Algorithm: m.Variant, DType: string(m.DType), Op: string(m.Op),
			World: m.World, Bytes: m.Bytes, Awkward: m.Awkward, Iters: m.Replays * m.OpsPerReplay, MedianUS: m.LatencyUS, BusGBps: m.BusGBps}
		if m.Variant == coll.Auto.String() {
			r.Picked = string(m.Algorithm)
		}
		if m.VsNCCL > 0 && m.Variant != coll.NCCL.String() {
			r.Baseline, r.Ratio = coll.NCCL.String(), m.VsNCCL
		}
		out = append(out, r)
	}
	return out
}

// awkwardNote is the footnote under a table with awkward rows: what the
// sweeps' awkward twins depart in (gpuSweeps gives every sweep the
// --awkward kind it parsed).
func awkwardNote(sweeps []gpuSweep) string {
	if len(sweeps) == 0 {
		return ""
	}
	return sweeps[0].cfg.Awkward.Describe()
}

// writeGPUSummary prints one block per (collective, dtype, op, world,
// mode): a row per size, a column per variant (latency in us), the
// algorithm auto picked, and auto's speed-up over NCCL; when forced
// generated algorithms were measured too, auto's latency over the fastest
// of them ("auto vs best", 1.03 = 3% slower; see autoVsBest), the check
// of "auto is within x% of its best algorithm" in every sweep.
func writeGPUSummary(w interface{ Write([]byte) (int, error) }, ms []gpubench.Measurement, awkwardText string) {
	type key struct {
		coll, dt, op, mode string
		world              int
	}
	var keys []key
	groups := map[key][]gpubench.Measurement{}
	for _, m := range ms {
		k := key{string(m.Collective), string(m.DType), string(m.Op), m.Mode, m.World}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], m)
	}
	for _, k := range keys {
		g := groups[k]
		var variants []string
		type at struct {
			row     gpubench.Row
			variant string
		}
		var rows []gpubench.Row
		cell := map[at]*gpubench.Measurement{}
		awkward, forced := false, false
		for i := range g {
			m := &g[i]
			if !slices.Contains(variants, m.Variant) {
				variants = append(variants, m.Variant)
				forced = forced || coll.Algorithm(m.Variant).Generated()
			}
			if !slices.Contains(rows, m.Row()) {
				rows = append(rows, m.Row())
			}
			cell[at{m.Row(), m.Variant}] = m
			awkward = awkward || m.Awkward
		}
		sort.SliceStable(rows, func(i, j int) bool {
			if rows[i].Bytes != rows[j].Bytes {
				return rows[i].Bytes < rows[j].Bytes
			}
			return !rows[i].Awkward && rows[j].Awkward
		})
		op := k.op
		if op == "" {
			op = "copy"
		}
		fmt.Fprintf(w, "%s %s %s, world %d, %s: per-op latency (us, median), busbw in GB/s for auto and nccl\n", k.coll, k.dt, op, k.world, modeText(k.mode))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		head := []string{"size"}
		head = append(head, variants...)
		head = append(head, "auto picks", "auto busbw", "nccl busbw", "auto vs nccl")
		if forced {
			head = append(head, "auto vs best")
		}
		fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
		for _, r := range rows {
			row := []string{gpubench.FormatSize(r.Bytes)}
			if r.Awkward {
				row[0] += "*"
			}
			for _, v := range variants {
				m := cell[at{r, v}]
				switch {
				case m == nil:
					row = append(row, "")
				case m.Measured():
					s := fmt.Sprintf("%.2f", m.LatencyUS)
					if m.CheckFailed() {
						s += "!"
					}
					row = append(row, s)
				case m.Skipped != "":
					row = append(row, "skip")
				default:
					row = append(row, "FAIL")
				}
			}
			a, n := cell[at{r, coll.Auto.String()}], cell[at{r, coll.NCCL.String()}]
			pick, abw, nbw, ratio := "", "", "", ""
			if a != nil {
				pick = string(a.Algorithm)
				if a.ZeroCopy {
					pick += " (in place)"
				}
				if a.Measured() {
					abw = fmt.Sprintf("%.1f", a.BusGBps)
					if a.VsNCCL > 0 {
						ratio = fmt.Sprintf("%.2fx", a.VsNCCL)
					}
				}
			}
			if n != nil && n.Measured() {
				nbw = fmt.Sprintf("%.1f", n.BusGBps)
			}
			row = append(row, pick, abw, nbw, ratio)
			if forced {
				var ms []*gpubench.Measurement
				for _, v := range variants {
					if coll.Algorithm(v).Generated() {
						ms = append(ms, cell[at{r, v}])
					}
				}
				row = append(row, autoVsBest(a, ms))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		tw.Flush()
		if awkward {
			fmt.Fprintln(w, "* awkward size: "+awkwardText)
		}
		fmt.Fprintln(w)
	}
}

// autoVsBest is the summary's "auto vs best" cell of one row: auto's
// latency over the fastest of the forced generated algorithms' (forced,
// nil where a variant has no measurement at this size), with its name. A
// forced row that was skipped, failed or whose --check failed is no
// candidate: its time is not that of a kernel computing the collective.
// When none is left the cell says so ("no valid forced"); when auto
// itself has no valid time the cell is empty (auto's own cell says skip,
// FAIL or !).
func autoVsBest(auto *gpubench.Measurement, forced []*gpubench.Measurement) string {
	if auto == nil || !auto.Measured() || auto.CheckFailed() {
		return ""
	}
	var best *gpubench.Measurement
	for _, m := range forced {
		if m != nil && m.Measured() && !m.CheckFailed() && (best == nil || m.LatencyUS < best.LatencyUS) {
			best = m
		}
	}
	if best == nil {
		return "no valid forced"
	}
	return fmt.Sprintf("%.2f (%s)", auto.LatencyUS/best.LatencyUS, best.Variant)
}

func modeText(mode string) string {
	if mode == "eager" {
		return "eager launches"
	}
	return "CUDA-graph replay"
}

// runGPUWorker is one rank process (environment from collgen run or
// benchGPUProcesses): its GPU is its local rank (or --devices[rank]).
// Rank 0 reports, or writes its measurements to --result-file.
func runGPUWorker(ctx context.Context, io *IO, o *BenchOptions, sweeps []gpuSweep) error {
	env, st, err := rendezvous.FromEnv(ctx)
	if err != nil {
		return fmt.Errorf("bench worker: %w", err)
	}
	defer st.Close()
	if err := o.checkRank0Outputs(env.Rank); err != nil {
		return err
	}
	var progress *os.File
	if env.Rank == 0 && o.resultFile != "" {
		if progress, err = os.OpenFile(o.resultFile+".progress", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			return err
		}
		defer progress.Close()
	}
	var (
		ms   []gpubench.Measurement
		logs bytes.Buffer
		rerr error
	)
	for i, s := range sweeps {
		s.cfg.Log = &logs
		if s.cfg.Devices == nil {
			s.cfg.Devices = make([]int, o.World)
			s.cfg.Devices[env.Rank] = env.LocalRank
		}
		if progress != nil {
			s.cfg.Progress = func(_, _ int, m *gpubench.Measurement) {
				fmt.Fprintln(progress, progressLabel(m))
				if !o.Progress {
					fmt.Fprintln(io.Err, measurementLine(m))
				}
			}
		}
		// Each sweep gets its own keys in the shared store.
		s.cfg.Group = fmt.Sprintf("bench%d", i)
		var got []gpubench.Measurement
		got, rerr = gpubench.RunRank(ctx, s.cfg, env.Rank, st)
		ms = append(ms, got...)
		if rerr != nil {
			break
		}
	}
	if env.Rank != 0 {
		return rerr
	}
	if o.resultFile != "" {
		b, err := json.Marshal(gpuWorkerResult{Measurements: ms, Log: logs.String(), Error: errString(rerr)})
		if err != nil {
			return err
		}
		if err := writeFileAtomic(o.resultFile, b, 0o600); err != nil {
			return err
		}
		return rerr
	}
	io.Err.Write(logs.Bytes())
	return reportGPU(io, o, ms, awkwardNote(sweeps), rerr)
}

// gpuWorkerResult is what rank 0 hands back to benchGPUProcesses.
type gpuWorkerResult struct {
	Measurements []gpubench.Measurement `json:"measurements"`
	Log          string                 `json:"log"`
	Error        string                 `json:"error,omitempty"`
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// benchGPUProcesses starts o.World GPU worker processes and reads rank 0's
// measurements back.
func benchGPUProcesses(ctx context.Context, io *IO, o *BenchOptions, g *gpuBenchFlags, prog *bench.Progress, logs *bytes.Buffer) ([]gpubench.Measurement, error) {
	sizes := o.Sizes
	if !g.sizesSet {
		sizes, _ = bench.ParseSizes(gpubench.DefaultSizes)
	}
	b, lerr, err := runWorkers(ctx, io, o, "gpu", sizes, workerFlags(g, o), prog)
	if err != nil {
		return nil, err
	}
	if b == nil {
		if lerr != nil {
			return nil, fmt.Errorf("bench: %w (the ranks' output is above)", lerr)
		}
		return nil, errors.New("bench: rank 0 wrote no results")
	}
	var res gpuWorkerResult
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("bench: rank 0's results: %w", err)
	}
	logs.WriteString(res.Log)
	if res.Error != "" {
		return res.Measurements, errors.New(res.Error)
	}
	if lerr != nil {
		return res.Measurements, fmt.Errorf("bench: %w (the ranks' output is above)", lerr)
	}
	return res.Measurements, nil
}

// workerFlags are the GPU flags --processes passes on to every worker
// process, so each rank sweeps exactly what the command line asked for.
func workerFlags(g *gpuBenchFlags, o *BenchOptions) []string {
	var extra []string
	if g.eager {
		extra = append(extra, "--eager")
	}
	if g.zeroCopy {
		extra = append(extra, "--zero-copy")
	}
	if g.awkward != "" {
		extra = append(extra, "--awkward="+g.awkward)
	}
	if g.noEarlyLaunch {
		extra = append(extra, "--no-early-launch")
	}
	if g.maxBlocks != 0 {
		extra = append(extra, "--max-blocks", strconv.Itoa(g.maxBlocks))
	}
	if g.ncclNonBlock {
		extra = append(extra, "--nccl-nonblocking")
	}
	if g.staging != "" {
		extra = append(extra, "--staging", g.staging)
	}
	if g.devices != "" {
		extra = append(extra, "--devices", g.devices)
	}
	if g.timeoutSet {
		extra = append(extra, "--timeout", o.Timeout.String())
	}
	return extra
}
