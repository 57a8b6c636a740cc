package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/bench/gpubench"
	"github.com/collgen/collgen/bench/hostbench"
	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/internal/meminfo"
	"github.com/collgen/collgen/runtime/host"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/launch"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
)

func init() { register("bench", newCmdBench) }

// gpuBench runs `collgen bench --backend gpu`; it is set by the file that
// links the GPU runtime. Nil means this binary has no GPU bench.
var gpuBench func(io *IO, o *BenchOptions) error

// hostLibrary supplies the host backend's reduce loops and selection rules:
// the generated library (this package already links it for the GPU bench).
// Nil would mean the portable loops of runtime/numeric (host.PortableLibrary).
var hostLibrary *kernels.Library = collectives.Library

// BenchOptions are `collgen bench`'s flags, shared by the host and GPU
// benches.
type BenchOptions struct {
	Backend     string        // host or gpu
	World       int           // ranks
	Sizes       []int64       // message sizes in bytes
	DTypes      []string      // element types to sweep, as named by coll.ParseDType
	Ops         []string      // reduce ops to sweep (ignored for all-gather)
	Collectives []string      // collectives to sweep
	Algorithms  []string      // empty: automatic selection per size
	Iters       int           // 0: by time
	Check       bool          // verify results before timing
	Goroutines  bool          // host: ranks are goroutines of this process
	JSON        string        // write results as JSON to this file ("-": stdout, instead of the table)
	CSV         string        // write results as CSV to this file
	PNG         string        // plot results into this PNG file
	Progress    bool          // draw the progress bar even when stderr is not a terminal
	Baseline    string        // JSON results (bench.Result) to compare with
	Memcpy      bool          // measure and print memcpy bandwidth
	SlotBytes   int           // host: Config.SlotBytes (0: default)
	Lanes       int           // host: Config.Lanes (0: default)
	Timeout     time.Duration // how long a rank waits for its peers (--timeout; host default 60s, gpu: comm.Config.Timeout)

	worker     bool           // host: this process is one rank (env from collgen run or the bench itself)
	baseline   []bench.Result // Baseline's rows, read by checkOutputs
	resultFile string         // worker rank 0: write JSON results here instead of printing
	gpu        gpuBenchFlags
}

// gpuBenchFlags are the GPU-only flags (see bench_gpu.go).
type gpuBenchFlags struct {
	eager         bool
	zeroCopy      bool
	noEarlyLaunch bool // comm.Config.NoEarlyLaunch
	maxBlocks     int  // comm.Config.MaxBlocks
	ncclNonBlock  bool // comm.Config.NCCLNonBlocking
	awkward       string
	processes     bool
	staging       string
	devices       string
	sizesSet      bool // --sizes given: otherwise the GPU default 1KiB..256MiB
	timeoutSet    bool // --timeout given: otherwise comm's default in-kernel timeout
}

// benchHelp holds functions that extend the bench command's help text
// (the GPU bench adds its mode from bench_gpu.go).
var benchHelp []func(*cobra.Command)

func newCmdBench(io *IO) *cobra.Command {
	o := &BenchOptions{}
	var sizes, dtypes, ops, colls, algs string
	cmd := &cobra.Command{
		Use:   "bench [--backend host|gpu] -n N [flags]",
		Short: "Benchmark collectives over a sweep of sizes and print a latency/bandwidth table",
		Long: `Bench times collectives for every combination of --collective, --algorithms,
--dtype, --op and --sizes and prints one table row per case: the median over
iterations of the slowest rank's time (host; on GPUs, rank 0's, see below),
and the bus bandwidth (NCCL's
convention: all-reduce bytes/time*2(W-1)/W, reduce-scatter and all-gather
bytes/time*(W-1)/W).

--backend host runs the shared-memory CPU backend across -n processes on this
host (bench starts them itself; or run "collgen run -n N -- collgen bench
--backend host --worker ...") or, with --goroutines, across -n goroutines.
--check verifies every case against a float64 reference before timing it.
--baseline FILE reads results of another run or backend (JSON, as --json
writes) and adds each row's speed-up over the baseline row of the same case
(collective, dtype, op, world, size, awkward twin or not) and algorithm, or
the case's only row (another backend's algorithm, named in the column): an
A/B of two collgen builds is one run with --json, the other with --baseline.
Auto's rows (algorithm "auto:PICKED" in the table) compare with the
baseline's auto rows, forced algorithms' rows with the same forced rows.
--memcpy prints the host's copy bandwidth.`,
		Example: `  collgen bench --backend host -n 4 --sizes 4KiB,64KiB,1MiB,16MiB --check
  collgen bench --backend host -n 8 --goroutines --collective allreduce,allgather --dtype f32,bf16
  collgen bench --backend host -n 4 --sizes 1KiB-64MiB --json out.json --png out.png`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkBackendFlags(cmd, o.Backend); err != nil {
				return usageError(err)
			}
			if sizes == "" {
				sizes = hostDefaultSizes
				if o.Backend == "gpu" {
					sizes = gpubench.DefaultSizes
				}
			}
			var err error
			if o.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return usageError(fmt.Errorf("bench: --sizes: %w", err))
			}
			o.DTypes, o.Ops, o.Collectives, o.Algorithms = splitList(dtypes), splitList(ops), splitList(colls), splitList(algs)
			if err := o.validate(); err != nil {
				return usageError(err)
			}
			if err := o.checkOutputs(); err != nil && !o.worker {
				return usageError(err)
			}
			o.gpu.sizesSet = cmd.Flags().Changed("sizes")
			o.gpu.timeoutSet = cmd.Flags().Changed("timeout")
			if o.Backend == "gpu" {
				if gpuBench == nil {
					return errors.New("bench: gpu bench is not built in this binary; use --backend host, or build collgen with the GPU runtime")
				}
				return gpuBench(io, o)
			}
			return runHostBench(io, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Backend, "backend", "gpu", "backend to benchmark: host or gpu")
	f.IntVarP(&o.World, "world", "n", 2, "number of ranks")
	f.StringVar(&sizes, "sizes", "", "message sizes: a list of sizes and doubling ranges FROM-TO or FROM..TO (a factor: FROM..TO:x4), e.g. 4KiB,64KiB or 1KiB-256MiB (default "+hostDefaultSizes+" on the host, "+gpubench.DefaultSizes+" on GPUs)")
	f.StringVar(&dtypes, "dtype", "f32", "element types, comma separated (host: f32 f64 f16 bf16 i32 i64)")
	f.StringVar(&ops, "op", "sum", "reduce ops, comma separated: sum, max, min")
	f.StringVar(&colls, "collective", "allreduce", "collectives, comma separated: allreduce, reduce_scatter, allgather")
	f.StringVar(&algs, "algorithms", "", "algorithms, comma separated, auto for the spec's choice per size (default: auto on the host; on GPUs every algorithm, auto and nccl); one a collective cannot run is left out of its sweep with a note")
	f.IntVar(&o.Iters, "iters", 0, "timed iterations per case (host; default: about 0.25s per case), or timed replays of 20 calls each (gpu; default: about 20 ms of them)")
	f.BoolVar(&o.Check, "check", false, "verify each case's result against a float64 reference before timing it")
	f.BoolVar(&o.Goroutines, "goroutines", false, "host: run the ranks as goroutines of this process instead of processes")
	f.StringVar(&o.JSON, "json", "", "also write results as JSON to `FILE` (\"-\": to stdout instead of the table)")
	f.StringVar(&o.CSV, "csv", "", "also write results as CSV to `FILE`")
	f.StringVar(&o.PNG, "png", "", "plot latency and bandwidth against size into `FILE`")
	f.BoolVar(&o.Progress, "progress", false, "show the progress bar even when stderr is not a terminal")
	f.StringVar(&o.Baseline, "baseline", "", "JSON results of another run or backend (e.g. gloo) to report speed-ups against, row by row")
	f.BoolVar(&o.Memcpy, "memcpy", false, "measure and print this host's memcpy bandwidth")
	f.IntVar(&o.SlotBytes, "slot-bytes", 0, "host: shared memory per slot per rank (default: the backend's)")
	f.IntVar(&o.Lanes, "lanes", 0, "host: threads per rank for large messages, the caller and lanes-1 helpers (default: the backend's)")
	f.DurationVar(&o.Timeout, "timeout", 60*time.Second, "how long a rank waits for its peers before failing (gpu: comm.Config.Timeout, 10s when not given)")
	f.BoolVar(&o.worker, "worker", false, "host: run as one rank whose environment comes from collgen run")
	f.StringVar(&o.resultFile, "result-file", "", "host worker: rank 0 writes JSON results here")
	f.MarkHidden("result-file")
	f.BoolVar(&o.gpu.eager, "eager", false, "gpu: time collectives launched one by one instead of CUDA-graph replays")
	f.BoolVar(&o.gpu.zeroCopy, "zero-copy", false, "gpu: put inputs in symmetric buffers, so generated kernels read them in place")
	f.BoolVar(&o.gpu.noEarlyLaunch, "no-early-launch", false, "gpu: launch kernels plainly, without programmatic dependent launch (comm.Config.NoEarlyLaunch)")
	f.StringVar(&o.gpu.awkward, "awkward", "", "gpu: after every size also its awkward twin (rows marked *): one element less (per rank) and input and output pointers one element off alignment; --awkward=count: only the element less, --awkward=offset: only the pointers")
	f.Lookup("awkward").NoOptDefVal = "both"
	f.BoolVar(&o.gpu.processes, "processes", false, "gpu: one process per GPU (started like collgen run) instead of one goroutine per GPU")
	f.IntVar(&o.gpu.maxBlocks, "max-blocks", 0, "gpu: at most this many blocks per kernel launch (comm.Config.MaxBlocks: SMs left to other work; default each kernel's spec max_blocks)")
	f.BoolVar(&o.gpu.ncclNonBlock, "nccl-nonblocking", false, "gpu: open NCCL non-blocking (comm.Config.NCCLNonBlocking: every NCCL wait bounded by --timeout), to compare its NCCL rows with the default blocking communicator's")
	f.StringVar(&o.gpu.staging, "staging", "", "gpu: staging buffer per rank (default: the largest size a generated algorithm is forced at)")
	f.StringVar(&o.gpu.devices, "devices", "", "gpu: CUDA ordinals of ranks 0..N-1, comma separated (default 0..N-1); a GPU named twice holds several ranks: NCCL is off and the times are the kernels' on one GPU")
	for _, add := range benchHelp {
		add(cmd)
	}
	return cmd
}

// hostDefaultSizes is the host bench's default --sizes.
const hostDefaultSizes = "1KiB-64MiB"

// Flags of one backend only: given with the other, they would be ignored,
// so bench refuses them.
var (
	gpuOnlyFlags  = []string{"eager", "zero-copy", "no-early-launch", "awkward", "processes", "max-blocks", "nccl-nonblocking", "staging", "devices"}
	hostOnlyFlags = []string{"goroutines", "slot-bytes", "lanes", "memcpy"}
)

// checkBackendFlags refuses a flag of the other backend.
func checkBackendFlags(cmd *cobra.Command, backend string) error {
	other, want := gpuOnlyFlags, "gpu"
	if backend == "gpu" {
		other, want = hostOnlyFlags, "host"
	}
	for _, name := range other {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("bench: --%s is a --backend %s flag, and this is --backend %s", name, want, backend)
		}
	}
	return nil
}

func (o *BenchOptions) validate() error {
	if o.Backend != "host" && o.Backend != "gpu" {
		return fmt.Errorf("bench: --backend %q: want host or gpu", o.Backend)
	}
	if o.World < 1 || o.World > 64 {
		return fmt.Errorf("bench: -n %d: want 1..64 ranks", o.World)
	}
	if o.Iters < 0 {
		return fmt.Errorf("bench: --iters %d: want a positive count, or 0 to time each case for about 0.25 s", o.Iters)
	}
	if o.Timeout < 0 {
		return fmt.Errorf("bench: --timeout %v: want a positive duration such as 60s", o.Timeout)
	}
	if o.SlotBytes < 0 {
		return fmt.Errorf("bench: --slot-bytes %d: want a positive size, or 0 for the backend's default", o.SlotBytes)
	}
	if o.Lanes < 0 || o.Lanes > host.MaxLanes {
		return fmt.Errorf("bench: --lanes %d: want 1..%d, or 0 for the backend's default", o.Lanes, host.MaxLanes)
	}
	if o.Backend == "host" { // the GPU bench checks its own (gpubench.Variants)
		for _, a := range o.Algorithms {
			if _, err := coll.ParseAlgorithm(a); err != nil {
				return fmt.Errorf("bench: --algorithms: %w", err)
			}
		}
	}
	for _, c := range o.Collectives {
		if _, err := coll.ParseCollective(c); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	if o.Backend == "host" {
		for _, d := range o.DTypes {
			if err := numeric.CheckDType(coll.DType(d)); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
		}
		for _, p := range o.Ops {
			if err := numeric.CheckOp(coll.Op(p)); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
		}
	}
	if len(o.Sizes) == 0 || len(o.DTypes) == 0 || len(o.Ops) == 0 || len(o.Collectives) == 0 {
		return errors.New("bench: --sizes, --dtype, --op and --collective must each name at least one value")
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items and
// repeats (--algorithms auto,auto measured every case twice).
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func (o *BenchOptions) sweep() hostbench.Options {
	algs := make([]coll.Algorithm, len(o.Algorithms))
	for i, a := range o.Algorithms {
		algs[i], _ = coll.ParseAlgorithm(a) // checked by validate; "auto" is coll.Auto
	}
	return hostbench.Options{Collectives: typed[coll.Collective](o.Collectives), Algorithms: algs,
		DTypes: typed[coll.DType](o.DTypes), Ops: typed[coll.Op](o.Ops), Sizes: o.Sizes, Iters: o.Iters, Check: o.Check}
}

// planHost checks the host sweep before any rank starts: it prints what
// the sweep leaves out, and refuses an empty sweep and one whose buffers
// would not fit in this host's available memory (a make of that size ends
// the process, with no error to report).
func (o *BenchOptions) planHost(io *IO) (int, error) {
	sw := o.sweep()
	cases, notes, err := hostbench.Plan(sw, o.World)
	for _, n := range notes {
		fmt.Fprintf(io.Err, "collgen bench: note: %s\n", n)
	}
	if err != nil {
		return 0, usageError(fmt.Errorf("bench: %w", err))
	}
	per := hostbench.Bytes(sw, cases, o.World)
	all := per * int64(o.World)
	if per > math.MaxInt64/int64(o.World) {
		all = math.MaxInt64 // sizes near 2^63: the product would wrap round
	}
	if avail, ok := meminfo.Available(); ok && all > avail {
		with := ""
		if o.Check {
			with = ", --check's reference inputs included"
		}
		return 0, usageError(fmt.Errorf("bench: the sweep's buffers take %s per rank (%s for %d ranks%s), more than the %s this host has available; lower --sizes",
			bench.FormatBytes(per), bench.FormatBytes(all), o.World, with, bench.FormatBytes(avail)))
	}
	return len(cases), nil
}

// typed converts flag values, checked by validate, to coll's names.
func typed[T ~string](xs []string) []T {
	out := make([]T, len(xs))
	for i, x := range xs {
		out[i] = T(x)
	}
	return out
}

func (o *BenchOptions) hostConfig(rank int, st rendezvous.Store, shared bool) host.Config {
	return host.Config{Rank: rank, WorldSize: o.World, Store: st, Group: "bench", Library: hostLibrary, Shared: shared,
		Timeout: o.Timeout, SlotBytes: o.SlotBytes, Lanes: o.Lanes}
}

func runHostBench(io *IO, o *BenchOptions) error {
	ctx, stop := interruptContext()
	defer stop()
	if o.worker {
		return runHostWorker(ctx, io, o)
	}
	if hostLibrary == nil {
		fmt.Fprintln(io.Err, "collgen bench: using the portable reduce loops (this binary has no generated library)")
	}
	total, err := o.planHost(io)
	if err != nil {
		return err
	}
	prog := bench.NewProgress(io.Err, total, o.Progress)
	var results []bench.Result
	if o.Goroutines {
		results, err = benchGoroutines(ctx, o, prog)
	} else {
		results, err = benchProcesses(ctx, io, o, prog)
	}
	prog.Finish()
	if se, ok := context.Cause(ctx).(signalError); ok {
		// Not the ranks' errors (context canceled) nor the SIGTERM that
		// stopped rank processes: the signal the user sent.
		return &ExitError{Code: se.exitCode(), Err: fmt.Errorf("bench: %w; stopped all ranks", se)}
	}
	if err != nil {
		return err
	}
	return report(io, o, results)
}

// interruptContext returns a context that Ctrl-C or SIGTERM cancels with
// a signalError as its cause, and the function that stops listening.
func interruptContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-sigs:
			cancel(signalError{sig})
		case <-ctx.Done():
		}
	}()
	return ctx, func() { signal.Stop(sigs); cancel(nil) }
}

// benchGoroutines runs the sweep on o.World goroutine ranks.
func benchGoroutines(ctx context.Context, o *BenchOptions, prog *bench.Progress) ([]bench.Result, error) {
	st := rendezvous.NewMemStore()
	defer st.Close()
	var wg sync.WaitGroup
	errs := make([]error, o.World)
	var results []bench.Result
	for r := 0; r < o.World; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := host.New(ctx, o.hostConfig(r, st, false))
			if err != nil {
				errs[r] = err
				return
			}
			defer g.Close()
			var progress func(int, string)
			if r == 0 {
				progress = func(_ int, label string) { prog.Step(label) }
			}
			res, err := hostbench.Run(ctx, g, o.sweep(), progress)
			errs[r] = err
			if r == 0 {
				results = res
			}
		}()
	}
	wg.Wait()
	return results, joinDistinct(errs)
}

// joinDistinct joins errs, each message once: ranks refused for the same
// reason (a bad flag) say it once.
func joinDistinct(errs []error) error {
	seen := map[string]bool{}
	var out []error
	for _, err := range errs {
		if err != nil && !seen[err.Error()] {
			seen[err.Error()] = true
			out = append(out, err)
		}
	}
	return errors.Join(out...)
}

// checkOutputs refuses, before a sweep, output files whose directory does
// not exist or that are directories, and a --baseline that cannot be read as bench results (which
// it keeps for report): a GPU sweep takes minutes, and its results would
// be lost at the end.
func (o *BenchOptions) checkOutputs() error {
	for _, f := range []struct{ flag, path string }{{"json", o.JSON}, {"csv", o.CSV}, {"png", o.PNG}} {
		if f.path == "-" && f.flag != "json" {
			// report writes no CSV for "-" and WritePNG a file named "-".
			return fmt.Errorf("bench: --%s -: only --json writes to standard output; name a file", f.flag)
		}
		if f.path == "" || f.path == "-" {
			continue
		}
		if fi, err := os.Stat(filepath.Dir(f.path)); err != nil || !fi.IsDir() {
			return fmt.Errorf("bench: --%s %s: its directory %s does not exist", f.flag, f.path, filepath.Dir(f.path))
		}
		if fi, err := os.Stat(f.path); err == nil && fi.IsDir() {
			return fmt.Errorf("bench: --%s %s is a directory; name a file", f.flag, f.path)
		}
	}
	if o.Baseline != "" {
		base, err := readBaseline(o.Baseline)
		if err != nil {
			return err
		}
		o.baseline = base
	}
	return nil
}

// checkRank0Outputs is checkOutputs for a worker rank that collgen run
// started: rank 0, which writes the outputs, checks them before its sweep
// (other ranks, maybe on other hosts, need not have rank 0's paths). A
// worker the bench started itself (resultFile) has none.
func (o *BenchOptions) checkRank0Outputs(rank int) error {
	if rank != 0 || o.resultFile != "" {
		return nil
	}
	if err := o.checkOutputs(); err != nil {
		return usageError(err)
	}
	return nil
}

// readBaseline reads a --baseline file: bench results, each naming its
// collective, world and size (JSON of another shape decodes into rows
// that match nothing).
func readBaseline(path string) ([]bench.Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: --baseline: %w", err)
	}
	defer f.Close()
	base, err := bench.ReadJSON(f)
	if err != nil {
		return nil, fmt.Errorf("bench: --baseline %s: %w", path, err)
	}
	for i, b := range base {
		if b.Collective == "" || b.World < 1 || b.Bytes < 1 {
			return nil, fmt.Errorf("bench: --baseline %s: result %d: want collective, world and bytes (as collgen bench --json writes), got %+v", path, i, b)
		}
	}
	return base, nil
}

// selfExe returns how to re-run this program: os.Args[0] (resolved through
// PATH when it has no slash), falling back to os.Executable.
func selfExe() (string, error) {
	if a := os.Args[0]; strings.ContainsRune(a, '/') {
		return a, nil
	} else if p, err := exec.LookPath(a); err == nil {
		return p, nil
	}
	return os.Executable()
}

// benchProcesses starts o.World host worker processes and reads rank 0's
// results back.
func benchProcesses(ctx context.Context, io *IO, o *BenchOptions, prog *bench.Progress) ([]bench.Result, error) {
	extra := []string{"--slot-bytes", strconv.Itoa(o.SlotBytes), "--lanes", strconv.Itoa(o.Lanes), "--timeout", o.Timeout.String()}
	out, lerr, err := runWorkers(ctx, io, o, "host", o.Sizes, extra, prog)
	if err != nil {
		return nil, err
	}
	if lerr != nil {
		var ee *launch.ExitError
		if errors.As(lerr, &ee) {
			return nil, &ExitError{Code: ee.Code, Err: fmt.Errorf("bench: %w (its output is above)", lerr)}
		}
		return nil, fmt.Errorf("bench: %w", lerr)
	}
	if out == nil {
		return nil, errors.New("bench: rank 0 wrote no results")
	}
	return bench.ReadJSON(bytes.NewReader(out))
}

// runWorkers starts o.World worker processes of this program (`collgen
// bench --backend B --worker`, the way collgen run does, with a file store
// in a temporary directory), shows rank 0's progress lines on prog, and
// returns the results file rank 0 wrote (nil if none) and the launch error.
// err is for failures to start at all.
func runWorkers(ctx context.Context, io *IO, o *BenchOptions, backend string, sizes []int64, extra []string, prog *bench.Progress) (out []byte, launchErr, err error) {
	exe, err := selfExe()
	if err != nil {
		return nil, nil, fmt.Errorf("bench: cannot find this program to start ranks: %w", err)
	}
	sweepBenchDirs("") // of benches killed before their own clean-up
	dir, err := os.MkdirTemp("", benchDirPrefix())
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	resFile := filepath.Join(dir, "results.json")
	args := []string{exe, "bench", "--backend", backend, "--worker", "--result-file", resFile,
		"-n", strconv.Itoa(o.World), "--sizes", joinSizes(sizes), "--dtype", strings.Join(o.DTypes, ","),
		"--op", strings.Join(o.Ops, ","), "--collective", strings.Join(o.Collectives, ","),
		"--algorithms", strings.Join(o.Algorithms, ","), "--iters", strconv.Itoa(o.Iters)}
	if o.Check {
		args = append(args, "--check")
	}
	args = append(args, extra...)
	done := make(chan struct{})
	go func() {
		// Rank 0 appends a line to resFile.progress per finished case.
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if b, err := os.ReadFile(resFile + ".progress"); err == nil && len(b) > 0 {
					lines := strings.Split(strings.TrimSpace(string(b)), "\n")
					prog.Set(len(lines), lines[len(lines)-1])
				}
			}
		}
	}()
	launchErr = launch.Run(ctx, launch.Config{N: o.World, Args: args, Store: "file://" + filepath.Join(dir, "store"),
		Stdout: io.Err, Stderr: io.Err})
	close(done)
	out, _ = os.ReadFile(resFile)
	return out, launchErr, nil
}

func joinSizes(s []int64) string {
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(parts, ",")
}

// runHostWorker is one rank process: its rank, world and store come from
// the environment collgen run (or benchProcesses) set.
func runHostWorker(ctx context.Context, io *IO, o *BenchOptions) error {
	env, st, err := rendezvous.FromEnv(ctx)
	if err != nil {
		return fmt.Errorf("bench worker: %w", err)
	}
	defer st.Close()
	o.World = env.WorldSize
	if err := o.checkRank0Outputs(env.Rank); err != nil {
		return err
	}
	g, err := host.New(ctx, o.hostConfig(env.Rank, st, true))
	if err != nil {
		return err
	}
	defer g.Close()
	var progress func(int, string)
	if env.Rank == 0 && o.resultFile != "" {
		pf, err := os.OpenFile(o.resultFile+".progress", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer pf.Close()
		progress = func(_ int, label string) { fmt.Fprintln(pf, label) }
	}
	results, err := hostbench.Run(ctx, g, o.sweep(), progress)
	if err != nil {
		return err
	}
	if env.Rank != 0 {
		return nil
	}
	if o.resultFile != "" {
		var b bytes.Buffer
		bench.WriteJSON(&b, results)
		return writeFileAtomic(o.resultFile, b.Bytes(), 0o600)
	}
	return report(io, o, results)
}

// report prints the table (or JSON to stdout) and writes the requested
// files.
func report(io *IO, o *BenchOptions, results []bench.Result) error {
	if o.Baseline != "" { // read by checkOutputs before the sweep
		matched, ambiguous := applyBaseline(o.baseline, results)
		if ambiguous > 0 {
			fmt.Fprintf(io.Err, "collgen bench: note: --baseline %s has several rows of the same case and algorithm for %d result(s); no speed-up for them\n", o.Baseline, ambiguous)
		}
		if matched == 0 && ambiguous == 0 && len(results) > 0 {
			fmt.Fprintf(io.Err, "collgen bench: note: --baseline %s has no row of a measured case (collective, dtype, op, world, size); no speed-ups\n", o.Baseline)
		}
	}
	var err error
	if o.JSON == "-" {
		err = bench.WriteJSON(io.Out, results)
	} else {
		err = bench.WriteTable(io.Out, results)
	}
	if err != nil {
		return err
	}
	write := func(path string, fn func(w *bufio.Writer) error) error {
		if path == "" || path == "-" {
			return nil
		}
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		w := bufio.NewWriter(f)
		if err := fn(w); err != nil {
			f.Close()
			return err
		}
		if err := w.Flush(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := write(o.JSON, func(w *bufio.Writer) error { return bench.WriteJSON(w, results) }); err != nil {
		return err
	}
	if err := write(o.CSV, func(w *bufio.Writer) error { return bench.WriteCSV(w, results) }); err != nil {
		return err
	}
	if o.PNG != "" {
		if err := bench.WritePNG(o.PNG, results); err != nil {
			return err
		}
	}
	if o.Memcpy {
		w := io.Out
		if o.JSON == "-" {
			w = io.Err // stdout is the JSON alone
		}
		printMemcpy(w, o, results)
	}
	return nil
}

// applyBaseline sets Baseline and Ratio on every result from the one
// baseline row it compares with, among the rows of the same collective,
// dtype, op, world, size and awkwardness (the case) with a time:
//
//   - the row of the same algorithm, where the automatic selection's row
//     ("auto") is an algorithm of its own: an auto row compares with the
//     baseline's auto row, never with a forced row of the algorithm auto
//     picked, and a forced row with the baseline's forced row (an A/B of
//     two collgen builds over the same algorithms);
//   - else, where the case has exactly one row, that row (another
//     backend, as gloo's "ring", or a file of an older host bench, whose
//     auto rows named the algorithm picked); Baseline then names its
//     algorithm too ("gloo ring").
//
// Several rows of the case with the result's algorithm (an older host
// bench's --algorithms auto,oneshot, whose auto row picking oneshot read
// "oneshot" like the forced one), or several rows none of its algorithm,
// give no ratio: which to compare with would be a guess (it used to be
// the last row). It returns how many results got a ratio, and how many
// got none because the baseline had several rows of their case and
// algorithm.
func applyBaseline(base, results []bench.Result) (matched, ambiguous int) {
	for i := range results {
		r := &results[i]
		var same, only *bench.Result
		n, nsame := 0, 0
		for j := range base {
			b := &base[j]
			if b.Collective != r.Collective || b.DType != r.DType || b.Op != r.Op || b.World != r.World || b.Bytes != r.Bytes || b.Awkward != r.Awkward || b.MedianUS <= 0 {
				continue
			}
			n++
			only = b
			if b.Algorithm == r.Algorithm {
				nsame++
				same = b
			}
		}
		name := ""
		switch {
		case nsame > 1:
			ambiguous++
			continue
		case nsame == 1:
			name = same.Backend
		case n == 1:
			same, name = only, only.Backend
			if only.Algorithm != "" && only.Algorithm != only.Backend {
				name += " " + only.Algorithm
			}
		default:
			continue
		}
		r.Baseline, r.Ratio = name, same.MedianUS/r.MedianUS
		matched++
	}
	return matched, ambiguous
}

// printMemcpy measures copy bandwidth with 1 and with World threads on a
// 256 MiB buffer and relates the largest all-reduce to it, on w.
func printMemcpy(w io.Writer, o *BenchOptions, results []bench.Result) {
	const size = 256 << 20
	one := hostbench.MemcpyGBps(size, 1)
	many := hostbench.MemcpyGBps(size, max(o.World, 1))
	all := hostbench.MemcpyGBps(size, runtime.NumCPU())
	fmt.Fprintf(w, "memcpy bandwidth (256MiB, copied bytes per second): 1 thread %.1f GB/s, %d threads %.1f GB/s, %d threads %.1f GB/s\n",
		one, o.World, many, runtime.NumCPU(), all)
	// The largest all-reduce measured (its size may be the asked one
	// rounded down to whole elements).
	largest := int64(0)
	for _, r := range results {
		if r.Collective == string(coll.AllReduce) {
			largest = max(largest, r.Bytes)
		}
	}
	for _, r := range results {
		if r.Collective == string(coll.AllReduce) && r.Bytes == largest {
			alg := float64(r.Bytes) / (r.MedianUS * 1e-6) / 1e9
			fmt.Fprintf(w, "%s %s %s: algbw %.2f GB/s, busbw %.2f GB/s = %.0f%% of 1-thread memcpy, %.0f%% of %d-thread memcpy\n",
				r.Collective, r.DType, bench.FormatBytes(r.Bytes), alg, r.BusGBps, 100*r.BusGBps/one, 100*r.BusGBps/many, o.World)
		}
	}
}
