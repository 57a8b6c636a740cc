// Package launch starts the N ranks of a program on this host, the way
// `collgen run` (and torchrun) do: each rank gets COLLGEN_RANK,
// COLLGEN_WORLD_SIZE, COLLGEN_LOCAL_RANK and COLLGEN_STORE, its output lines
// are prefixed with "[rank R] ", and the first rank to fail takes the others
// down (SIGTERM, then SIGKILL after a grace period) and decides the exit
// code. Every run gets a fresh run id (COLLGEN_RUN_ID): ranks key the store
// and name their shared-memory segments by it, and once every rank has
// exited the launcher removes the segments and file-store keys of the run
// that killed ranks left behind.
package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// DefaultGrace is how long stopped ranks get between SIGTERM and SIGKILL.
const DefaultGrace = 5 * time.Second

// MaxRanks bounds Config.N: one host runs at most this many ranks (each
// needs a few file descriptors and a process; collectives go up to 64).
const MaxRanks = 1024

// ErrTooManyRanks is wrapped by Start when Config.N is above MaxRanks or
// above what the file-descriptor limit allows.
var ErrTooManyRanks = errors.New("launch: too many ranks")

// ErrInvalidArgument is wrapped by Start, StartContext, Run and
// CheckNodes when Config cannot describe a run: fewer than one rank, no
// program, a malformed run id, or a node layout that cannot be (see
// CheckNodes). The error's text is the check's alone.
var ErrInvalidArgument = errors.New("launch: invalid argument")

// configError is a Config that Start refuses: its text names the field,
// and errors.Is matches ErrInvalidArgument (and the cause, if any).
type configError struct {
	msg   string
	cause error
}

// Error is the message, which names the field and what to pass instead.
func (e *configError) Error() string { return e.msg }

// Unwrap makes errors.Is match ErrInvalidArgument and the cause.
func (e *configError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrInvalidArgument}
	}
	return []error{ErrInvalidArgument, e.cause}
}

// invalidf formats a configError; a %w verb's operand is its cause.
func invalidf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &configError{msg: err.Error(), cause: errors.Unwrap(err)}
}

// settleWindow is how long Wait, after a rank exits with a non-zero status,
// waits for other ranks' exits before naming the cause: a rank killed by a
// signal is usually why a peer then failed, and its exit may be reaped a
// moment later than the peer's.
const settleWindow = 150 * time.Millisecond

// Config describes a group of ranks to start.
type Config struct {
	// N is the number of ranks (the world size); at least 1.
	N int
	// Args is the program and its arguments, the same for every rank.
	Args []string
	// Env is the base environment (nil: this process's). Any COLLGEN_RANK,
	// COLLGEN_WORLD_SIZE, COLLGEN_LOCAL_RANK and COLLGEN_STORE in it are
	// replaced per rank.
	Env []string
	// Store is the COLLGEN_STORE every rank gets (tcp://host:port or
	// file:///path).
	Store string
	// Secret, if non-empty, is passed to ranks as COLLGEN_STORE_SECRET.
	Secret string
	// Dir is the ranks' working directory ("" : this process's).
	Dir string
	// Stdout and Stderr receive the ranks' prefixed output lines, and
	// Stderr the launcher's own messages. Nil discards.
	Stdout, Stderr io.Writer
	// Grace is the SIGTERM-to-SIGKILL delay when stopping ranks; default
	// DefaultGrace.
	Grace time.Duration
	// RunID is the run's generation, passed to ranks as COLLGEN_RUN_ID
	// (8 to 16 letters and digits); "" makes a fresh random one.
	RunID string
	// ShmDir is where Wait sweeps the run's shared-memory segments, and
	// where the launcher keeps its run record ("" : /dev/shm): a launcher
	// killed before its sweep (SIGKILL from a scheduler) has its run's
	// segments swept by the next launcher that starts (shm.ClaimRun,
	// shm.SweepDeadRuns). Tests point it elsewhere.
	ShmDir string
	// Nodes and NodeRank place this launcher's ranks in a world spanning
	// hosts (0: one node): it starts ranks NodeRank*N to NodeRank*N+N-1 of
	// Nodes*N, with local ranks 0 to N-1, and reports global ranks. Every
	// node needs the same N, Store and RunID; a file store is refused
	// (each launcher removes the run's directory when its ranks exit).
	Nodes, NodeRank int
}

// ExitError reports why a group did not succeed: the rank whose failure
// came first (Rank ≥ 0), or an interrupt (Rank −1). A rank killed by a
// signal is preferred as the cause over peers that exited with an error
// around the same time, since their errors usually follow from its death.
// Code is the exit code to pass on: the rank's own exit status, or
// 128+signal for a rank killed by a signal and for an interrupt.
type ExitError struct {
	Rank   int       // the failing rank, -1 for an interrupt
	Code   int       // the exit code to pass on
	Signal os.Signal // the signal that killed the rank, or that interrupted the group
	// Stopped lists, ascending, the ranks that the launcher stopped
	// (SIGTERM/SIGKILL) and that then exited with an error: their own
	// messages are consequences of the stop, not causes.
	Stopped []int
}

// Error says which rank failed and how ("rank 2 was killed by SIGKILL"),
// or which signal interrupted the group.
func (e *ExitError) Error() string {
	switch {
	case e.Rank < 0:
		return fmt.Sprintf("interrupted by %s; stopped all ranks", SignalName(e.Signal))
	case e.Signal != nil:
		return fmt.Sprintf("rank %d was killed by %s", e.Rank, SignalName(e.Signal))
	default:
		return fmt.Sprintf("rank %d exited with status %d", e.Rank, e.Code)
	}
}

// Group is a started set of ranks.
type Group struct {
	cfg     Config
	cmds    []*exec.Cmd
	outs    []*prefixWriter
	results chan result
	// unrecord removes this launcher's run record (shm.ClaimRun) once
	// cleanup has swept the run; nil without one.
	unrecord func() error

	mu       sync.Mutex
	exited   []bool
	stopping bool
	killer   *time.Timer
	stopSig  os.Signal  // what stop sent first
	killSent bool       // SIGKILL has been sent to the ranks
	first    *ExitError // first failure, or the interrupt
}

// RunID returns the run id every rank got as COLLGEN_RUN_ID.
func (g *Group) RunID() string { return g.cfg.RunID }

type result struct {
	rank int
	err  error
}

// Start starts every rank. If a rank cannot start, the ranks already started
// are killed and Start returns the error.
func Start(cfg Config) (*Group, error) { return StartContext(context.Background(), cfg) }

// StartContext is Start, stopping early when ctx is cancelled (a Ctrl-C
// while many ranks start): the ranks already started are killed and
// reaped, and the error wraps ctx's.
func StartContext(ctx context.Context, cfg Config) (*Group, error) {
	if cfg.N < 1 {
		return nil, invalidf("launch: %d ranks: want at least 1", cfg.N)
	}
	if cfg.N > MaxRanks {
		return nil, fmt.Errorf("%w: %d ranks, at most %d on one host", ErrTooManyRanks, cfg.N, MaxRanks)
	}
	if err := checkFDs(cfg.N); err != nil {
		return nil, err
	}
	if err := checkNodes(cfg); err != nil {
		return nil, err
	}
	if cfg.RunID == "" {
		var b [8]byte
		rand.Read(b[:])
		cfg.RunID = hex.EncodeToString(b[:])
	}
	if err := rendezvous.CheckRunID(cfg.RunID); err != nil {
		return nil, invalidf("launch: %w", err)
	}
	if len(cfg.Args) == 0 {
		return nil, invalidf("launch: no program to run")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	base := cfg.Env
	if base == nil {
		base = os.Environ()
	}
	base = withoutVars(base, rendezvous.EnvRank, rendezvous.EnvWorldSize, rendezvous.EnvLocalRank, rendezvous.EnvStore, rendezvous.EnvRunID)
	if cfg.Secret != "" {
		base = append(withoutVars(base, rendezvous.EnvSecret), rendezvous.EnvSecret+"="+cfg.Secret)
	}
	g := &Group{cfg: cfg, results: make(chan result, cfg.N), exited: make([]bool, cfg.N)}
	if err := g.claimRunDir(); err != nil {
		return nil, err
	}
	g.recordRun()
	// One lock for both streams keeps every line whole and in order.
	var outMu sync.Mutex
	first, world := cfg.NodeRank*cfg.N, cfg.N*max(cfg.Nodes, 1)
	for r := range cfg.N {
		cmd := exec.Command(cfg.Args[0], cfg.Args[1:]...)
		cmd.Dir = cfg.Dir
		cmd.Env = append(append([]string(nil), base...),
			rendezvous.EnvRank+"="+strconv.Itoa(first+r),
			rendezvous.EnvWorldSize+"="+strconv.Itoa(world),
			rendezvous.EnvLocalRank+"="+strconv.Itoa(r),
			rendezvous.EnvStore+"="+cfg.Store,
			rendezvous.EnvRunID+"="+cfg.RunID,
		)
		prefix := fmt.Sprintf("[rank %d] ", first+r)
		stdout := &prefixWriter{mu: &outMu, w: cfg.Stdout, prefix: prefix}
		stderr := &prefixWriter{mu: &outMu, w: cfg.Stderr, prefix: prefix}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		setProcGroup(cmd)
		// If a rank leaves children holding its output open, give up on
		// them this long after the rank exits.
		cmd.WaitDelay = cfg.Grace + time.Second
		err := ctx.Err()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			for _, c := range g.cmds {
				killGroup(c, syscall.SIGKILL)
				c.Wait()
			}
			g.cleanup()
			return nil, fmt.Errorf("launch: start rank %d: %w", first+r, err)
		}
		g.cmds = append(g.cmds, cmd)
		g.outs = append(g.outs, stdout, stderr)
	}
	for r, cmd := range g.cmds {
		go func() {
			err := cmd.Wait()
			g.mu.Lock()
			g.exited[r] = true
			g.mu.Unlock()
			g.results <- result{first + r, err}
		}()
	}
	return g, nil
}

// Signal forwards sig (usually the user's Ctrl-C or a SIGTERM) to every
// running rank and kills those still running after the grace period. The
// group then ends with an interrupt ExitError unless a rank had already
// failed. A second Signal kills every rank at once.
func (g *Group) Signal(sig os.Signal) {
	g.mu.Lock()
	again := g.stopping
	if g.first == nil {
		g.first = &ExitError{Rank: -1, Code: signalCode(sig), Signal: sig}
	}
	g.mu.Unlock()
	if again {
		g.signalAll(syscall.SIGKILL)
		return
	}
	g.stop(sig)
}

// stop sends sig to every running rank and arms the SIGKILL timer; it acts
// once.
func (g *Group) stop(sig os.Signal) {
	g.mu.Lock()
	if g.stopping {
		g.mu.Unlock()
		return
	}
	g.stopping = true
	g.stopSig = sig
	g.killer = time.AfterFunc(g.cfg.Grace, func() { g.signalAll(syscall.SIGKILL) })
	g.mu.Unlock()
	g.signalAll(sig)
	// A stopped rank (SIGSTOP, a debugger's Ctrl-Z) would hold the signal
	// pending until SIGKILL after the grace period; let it run so it can
	// handle the signal and clean up now.
	g.mu.Lock()
	for r, cmd := range g.cmds {
		if !g.exited[r] {
			continueGroup(cmd)
		}
	}
	g.mu.Unlock()
}

// signalAll signals the process group of every rank not yet reaped (a
// reaped rank's pid may be reused).
func (g *Group) signalAll(sig os.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if sig == syscall.SIGKILL {
		g.killSent = true
	}
	for r, cmd := range g.cmds {
		if !g.exited[r] {
			killGroup(cmd, sig)
		}
	}
}

// Wait waits for every rank. It returns nil when all exit 0, and otherwise
// an *ExitError for the rank whose failure is the cause (or for the
// interrupt). When a rank fails, Wait stops the others (SIGTERM, then
// SIGKILL after the grace period) and says so on Stderr. Once every rank
// has exited it removes what the run left behind: shared-memory segments
// named with the run id (those of ranks killed during set-up) and, for a
// file store, the run's directory (see rendezvous.RunDir).
func (g *Group) Wait() error {
	var (
		failures []*ExitError // failures before the launcher stopped anyone
		also     []*ExitError // later failures the launcher did not cause
		stopped  []int
		settle   <-chan time.Time
		decided  bool
	)
	decide := func() {
		decided, settle = true, nil
		cause := failures[0]
		for _, f := range failures {
			if f.Signal != nil {
				cause = f
				break
			}
		}
		for _, f := range failures {
			if f != cause {
				stopped = append(stopped, f.Rank)
			}
		}
		g.mu.Lock()
		first := g.first == nil
		if first {
			g.first = cause
		}
		g.mu.Unlock()
		if first {
			fmt.Fprintf(g.cfg.Stderr, "collgen run: %v; stopping the other ranks\n", cause)
			g.stop(syscall.SIGTERM)
		}
	}
	for left := len(g.cmds); left > 0; {
		select {
		case res := <-g.results:
			left--
			code, sig := exitStatus(res.err)
			if errors.Is(res.err, exec.ErrWaitDelay) {
				fmt.Fprintf(g.cfg.Stderr, "collgen run: rank %d exited; processes it left still held its output %v later, no longer read\n", res.rank, g.cfg.Grace+time.Second)
			}
			if code == 0 {
				continue
			}
			g.mu.Lock()
			stopping := g.stopping
			// Did our stop end it? An exit status, or the signals we sent;
			// anything else (a SIGKILL before ours, a SIGSEGV) is a
			// failure of its own.
			ours := sig == nil || sig == g.stopSig || sig == syscall.SIGKILL && g.killSent
			g.mu.Unlock()
			if decided || stopping {
				if ours {
					stopped = append(stopped, res.rank)
				} else {
					also = append(also, &ExitError{Rank: res.rank, Code: code, Signal: sig})
				}
				continue
			}
			failures = append(failures, &ExitError{Rank: res.rank, Code: code, Signal: sig})
			if sig != nil {
				decide()
			} else if settle == nil {
				settle = time.After(settleWindow)
			}
		case <-settle:
			decide()
		}
	}
	if !decided && len(failures) > 0 {
		decide()
	}
	for _, w := range g.outs {
		w.flush()
	}
	g.mu.Lock()
	if g.killer != nil {
		g.killer.Stop()
	}
	first := g.first
	g.mu.Unlock()
	if first != nil && first.Rank >= 0 && len(stopped) > 0 {
		slices.Sort(stopped)
		first.Stopped = stopped
		whose := "their errors follow"
		if len(stopped) == 1 {
			whose = "its errors follow"
		}
		fmt.Fprintf(g.cfg.Stderr, "collgen run: %s stopped after rank %d failed; %s from that\n", rankList(stopped), first.Rank, whose)
	}
	for _, a := range also {
		fmt.Fprintf(g.cfg.Stderr, "collgen run: %v as well (not stopped by collgen run)\n", a)
	}
	g.cleanup()
	if first == nil {
		return nil
	}
	return first
}

// rankList reads "rank 3" or "ranks 0, 1 and 3".
func rankList(ranks []int) string {
	if len(ranks) == 1 {
		return "rank " + strconv.Itoa(ranks[0])
	}
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	return "ranks " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// recordRun sweeps the segments of runs whose launcher is gone (killed
// before its own sweep: no rank of such a run is alive, since ranks die
// with their launcher) and records this run, so the next launcher can do
// the same for it. Both are best effort: a /dev/shm this user cannot
// write leaves nothing to sweep.
func (g *Group) recordRun() {
	runs, removed, err := sweepDeadRuns(g.cfg.ShmDir)
	switch {
	case len(removed) > 0:
		fmt.Fprintf(g.cfg.Stderr, "collgen run: removed %d shared-memory segment(s) of %d run(s) whose launcher was killed: %s\n", len(removed), len(runs), strings.Join(removed, ", "))
	case len(runs) > 0:
		fmt.Fprintf(g.cfg.Stderr, "collgen run: cleared the record of %d run(s) whose launcher was killed (their segments were gone already)\n", len(runs))
	}
	if err != nil {
		fmt.Fprintf(g.cfg.Stderr, "collgen run: %v\n", err)
	}
	if release, err := claimRun(g.cfg.ShmDir, g.cfg.RunID); err == nil {
		g.unrecord = release
	}
}

// launcherFile, in a file store's run directory, names the launcher that
// owns the run ("<hostname> <pid>"), so a later launcher can remove the
// directory once that one is gone.
const launcherFile = ".launcher"

// claimRunDir, for a file store, removes the run directories of launchers
// on this host that no longer run (killed before they could clean up: old
// generations are never adopted, and this keeps them from piling up), then
// creates this run's directory with its launcher file.
func (g *Group) claimRunDir() error {
	scheme, dir, err := rendezvous.ParseStoreAddr(g.cfg.Store)
	if err != nil || scheme != "file" {
		return nil
	}
	host, _ := os.Hostname()
	if ents, err := os.ReadDir(dir); err == nil {
		var removed []string
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), "run-") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name(), launcherFile))
			if err != nil {
				continue // not a launcher's run: leave it
			}
			var h string
			var pid int
			if n, _ := fmt.Sscanf(string(b), "%s %d", &h, &pid); n != 2 || h != host || !processGone(pid) {
				continue
			}
			if os.RemoveAll(filepath.Join(dir, e.Name())) == nil {
				removed = append(removed, e.Name())
			}
		}
		if len(removed) > 0 {
			fmt.Fprintf(g.cfg.Stderr, "collgen run: removed %d stale run(s) of launchers that are gone from the store: %s\n", len(removed), strings.Join(removed, ", "))
		}
	}
	run := rendezvous.RunDir(dir, g.cfg.RunID)
	if err := os.MkdirAll(run, 0o700); err != nil {
		return fmt.Errorf("launch: file store: %w", err)
	}
	if err := os.WriteFile(filepath.Join(run, launcherFile), fmt.Appendf(nil, "%s %d\n", host, os.Getpid()), 0o600); err != nil {
		return fmt.Errorf("launch: file store: %w", err)
	}
	return nil
}

// cleanup removes what the run's ranks may have left: shared-memory
// segments carrying the run id, and a file store's run directory. It runs
// when no rank of the run is alive any more.
func (g *Group) cleanup() {
	removed, err := sweepShm(g.cfg.ShmDir, g.cfg.RunID)
	if len(removed) > 0 {
		fmt.Fprintf(g.cfg.Stderr, "collgen run: removed %d shared-memory segment(s) left by the ranks: %s\n", len(removed), strings.Join(removed, ", "))
	}
	if err != nil {
		fmt.Fprintf(g.cfg.Stderr, "collgen run: %v\n", err)
	} else if g.unrecord != nil {
		if err := g.unrecord(); err != nil {
			fmt.Fprintf(g.cfg.Stderr, "collgen run: %v\n", err)
		}
	}
	if scheme, dir, err := rendezvous.ParseStoreAddr(g.cfg.Store); err == nil && scheme == "file" {
		if err := os.RemoveAll(rendezvous.RunDir(dir, g.cfg.RunID)); err != nil {
			fmt.Fprintf(g.cfg.Stderr, "collgen run: remove the run's store keys: %v\n", err)
		}
	}
}

// Run starts the group and waits for it. Cancelling ctx stops the ranks
// like Signal(SIGTERM).
func Run(ctx context.Context, cfg Config) error {
	g, err := StartContext(ctx, cfg)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { g.Signal(syscall.SIGTERM) })
	defer stop()
	return g.Wait()
}

// exitStatus turns cmd.Wait's error into an exit code (0 for success) and
// the signal that killed the process, if any.
func exitStatus(err error) (int, os.Signal) {
	if err == nil || errors.Is(err, exec.ErrWaitDelay) {
		// ErrWaitDelay: the rank exited 0 and children it left held its
		// output open past WaitDelay; the launcher gave up on them, and
		// the rank still succeeded.
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 1, nil // e.g. an output copy error
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return signalCode(ws.Signal()), ws.Signal()
	}
	if c := ee.ExitCode(); c > 0 {
		return c, nil
	}
	return 1, nil
}

// signalCode is the shell's exit code for death by sig: 128+number.
func signalCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 130
}

// withoutVars drops the named variables from env.
func withoutVars(env []string, names ...string) []string {
	out := make([]string, 0, len(env))
next:
	for _, kv := range env {
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

// checkNodes checks a multi-node configuration: a node rank within Nodes,
// a world (N × Nodes) of at most rendezvous.MaxWorldSize ranks, a store
// every node can reach other than a file store, and a run id shared by
// every node (a fresh one per launcher would split the run).
// CheckNodes checks the multi-node part of cfg (Nodes, NodeRank, Store,
// RunID) as StartContext does, so that a CLI can report it as a usage
// error before starting anything.
func CheckNodes(cfg Config) error { return checkNodes(cfg) }

func checkNodes(cfg Config) error {
	if cfg.Nodes < 0 || cfg.NodeRank < 0 || cfg.NodeRank >= max(cfg.Nodes, 1) {
		return invalidf("launch: node rank %d of %d nodes: want 0 <= node rank < nodes", cfg.NodeRank, cfg.Nodes)
	}
	// N × Nodes is the world every rank gets: past what a rank takes (and
	// before it overflows to a world of 0 or less).
	if cfg.N > 0 && max(cfg.Nodes, 1) > rendezvous.MaxWorldSize/cfg.N {
		return invalidf("launch: %d nodes of %d ranks each: a world of more than %d ranks (rendezvous.MaxWorldSize); want at most %d nodes",
			cfg.Nodes, cfg.N, rendezvous.MaxWorldSize, rendezvous.MaxWorldSize/cfg.N)
	}
	if cfg.Nodes <= 1 {
		return nil
	}
	scheme, _, err := rendezvous.ParseStoreAddr(cfg.Store)
	switch {
	case cfg.Store == "":
		return invalidf("launch: %d nodes need a store every node reaches (an etcd:// or tcp:// address)", cfg.Nodes)
	case err != nil:
		return invalidf("launch: %w", err)
	case scheme == "file":
		return invalidf("launch: %d nodes cannot share file store %s: each launcher removes the run's directory when its own ranks exit; use an etcd:// or tcp:// store", cfg.Nodes, cfg.Store)
	case cfg.RunID == "":
		return invalidf("launch: %d nodes need the same run id on every node (%s); a fresh one per launcher would split the run", cfg.Nodes, rendezvous.EnvRunID)
	}
	return nil
}
