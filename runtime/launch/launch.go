// Package launch starts the N ranks of a program on this host, the way
// `collgen run` (and torchrun) do: each rank gets COLLGEN_RANK,
// COLLGEN_WORLD_SIZE, COLLGEN_LOCAL_RANK and COLLGEN_STORE, its output lines
// are prefixed with "[rank R] ", and the first rank to fail takes the others
// down (SIGTERM, then SIGKILL after a grace period) and decides the exit
// code.
package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// DefaultGrace is how long stopped ranks get between SIGTERM and SIGKILL.
const DefaultGrace = 5 * time.Second

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
}

// ExitError reports why a group did not succeed: the first rank that failed
// (Rank ≥ 0), or an interrupt (Rank −1). Code is the exit code to pass on:
// the rank's own exit status, or 128+signal for a rank killed by a signal
// and for an interrupt.
type ExitError struct {
	Rank   int
	Code   int
	Signal os.Signal // the signal that killed the rank, or that interrupted the group
}

// Error says which rank failed and how, or which signal interrupted the group.
func (e *ExitError) Error() string {
	switch {
	case e.Rank < 0:
		return fmt.Sprintf("interrupted by %v; stopped all ranks", e.Signal)
	case e.Signal != nil:
		return fmt.Sprintf("rank %d was killed by %v", e.Rank, e.Signal)
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

	mu       sync.Mutex
	exited   []bool
	stopping bool
	killer   *time.Timer
	first    *ExitError // first failure, or the interrupt
}

type result struct {
	rank int
	err  error
}

// Start starts every rank. If a rank cannot start, the ranks already started
// are killed and Start returns the error.
func Start(cfg Config) (*Group, error) {
	if cfg.N < 1 {
		return nil, fmt.Errorf("launch: %d ranks: want at least 1", cfg.N)
	}
	if len(cfg.Args) == 0 {
		return nil, errors.New("launch: no program to run")
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
	base = withoutVars(base, rendezvous.RankEnv, rendezvous.WorldSizeEnv, rendezvous.LocalRankEnv, rendezvous.StoreEnv)
	if cfg.Secret != "" {
		base = append(withoutVars(base, rendezvous.SecretEnv), rendezvous.SecretEnv+"="+cfg.Secret)
	}
	g := &Group{cfg: cfg, results: make(chan result, cfg.N), exited: make([]bool, cfg.N)}
	// One lock for both streams keeps every line whole and in order.
	var outMu sync.Mutex
	for r := range cfg.N {
		cmd := exec.Command(cfg.Args[0], cfg.Args[1:]...)
		cmd.Dir = cfg.Dir
		cmd.Env = append(append([]string(nil), base...),
			rendezvous.RankEnv+"="+strconv.Itoa(r),
			rendezvous.WorldSizeEnv+"="+strconv.Itoa(cfg.N),
			rendezvous.LocalRankEnv+"="+strconv.Itoa(r),
			rendezvous.StoreEnv+"="+cfg.Store,
		)
		prefix := fmt.Sprintf("[rank %d] ", r)
		stdout := &prefixWriter{mu: &outMu, w: cfg.Stdout, prefix: prefix}
		stderr := &prefixWriter{mu: &outMu, w: cfg.Stderr, prefix: prefix}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		setProcGroup(cmd)
		// If a rank leaves children holding its output open, give up on
		// them this long after the rank exits.
		cmd.WaitDelay = cfg.Grace + time.Second
		if err := cmd.Start(); err != nil {
			for _, c := range g.cmds {
				killGroup(c, syscall.SIGKILL)
				c.Wait()
			}
			return nil, fmt.Errorf("launch: start rank %d: %w", r, err)
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
			g.results <- result{r, err}
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
	g.killer = time.AfterFunc(g.cfg.Grace, func() { g.signalAll(syscall.SIGKILL) })
	g.mu.Unlock()
	g.signalAll(sig)
}

// signalAll signals the process group of every rank not yet reaped (a
// reaped rank's pid may be reused).
func (g *Group) signalAll(sig os.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for r, cmd := range g.cmds {
		if !g.exited[r] {
			killGroup(cmd, sig)
		}
	}
}

// Wait waits for every rank. It returns nil when all exit 0, and otherwise
// an *ExitError for the first rank that failed (or for the interrupt).
// When a rank fails, Wait stops the others (SIGTERM, then SIGKILL after the
// grace period) and says so on Stderr.
func (g *Group) Wait() error {
	for range g.cmds {
		res := <-g.results
		code, sig := exitStatus(res.err)
		if code == 0 {
			continue
		}
		g.mu.Lock()
		first := g.first == nil
		if first {
			g.first = &ExitError{Rank: res.rank, Code: code, Signal: sig}
		}
		g.mu.Unlock()
		if first {
			fmt.Fprintf(g.cfg.Stderr, "collgen run: %v; stopping the other ranks\n", g.first)
			g.stop(syscall.SIGTERM)
		}
	}
	for _, w := range g.outs {
		w.flush()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.killer != nil {
		g.killer.Stop()
	}
	if g.first != nil {
		return g.first
	}
	return nil
}

// Run starts the group and waits for it. Cancelling ctx stops the ranks
// like Signal(SIGTERM).
func Run(ctx context.Context, cfg Config) error {
	g, err := Start(cfg)
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
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 1, nil // e.g. an output copy error after WaitDelay
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
