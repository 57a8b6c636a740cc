package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/runtime/launch"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// storeChecks check the rest of a --store address of a scheme whose
// store is linked in (etcd.go), before any rank starts.
var storeChecks = map[string]func(rest string) error{}

func init() { register("run", newCmdRun) }

// usageError makes err exit with code 2, like a flag error.
func usageError(err error) error { return &ExitError{Code: 2, Err: err} }

func newCmdRun(io *IO) *cobra.Command {
	var (
		n     int
		store string
		grace time.Duration
		// Multi-node runs: every node's launcher gets the same --nnodes,
		// --store and --run-id, and its own --node-rank.
		nodes, nodeRank int
		runID           string
	)
	cmd := &cobra.Command{
		Use:   "run -n N [--store ADDR] -- CMD [ARGS...]",
		Short: "Start N ranks of a program on this host, like torchrun",
		Long: `Run starts N copies of CMD, one per rank, each with COLLGEN_RANK,
COLLGEN_WORLD_SIZE, COLLGEN_LOCAL_RANK and COLLGEN_STORE set. Without --store
it serves a TCP store on a free loopback port for the ranks, protected by
$COLLGEN_STORE_SECRET or, when that is unset, a fresh random secret passed
to the ranks only.

Every output line is prefixed with "[rank R] ". When a rank fails the others
get SIGTERM, then SIGKILL after --grace, and run exits with the failing
rank's code (128+N for a rank killed by signal N). Ctrl-C, SIGTERM, SIGHUP
(a dropped ssh session) or SIGQUIT is forwarded to every rank; a second one
kills them at once. --grace 0 kills at once.

A run spanning hosts runs one collgen run per host with the same -n,
--nnodes, --run-id and --store (etcd://host:2379, or a tcp:// store every
host reaches), and each host's --node-rank: host I starts ranks I*N to
I*N+N-1 (docs/multihost.md).`,
		Example: `  collgen run -n 4 -- ./allreduce-bench --size 64MiB
  collgen run -n 2 --store file:///shared/rdzv -- ./prog
  # two hosts of 8 GPUs, rendezvous through etcd (run on each host):
  collgen run -n 8 --nnodes 2 --node-rank $NODE --run-id job42abc --store etcd://etcd1:2379 -- ./prog`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 || n > launch.MaxRanks {
				return usageError(fmt.Errorf("run: -n must be 1..%d (got %d)", launch.MaxRanks, n))
			}
			if len(args) == 0 {
				return usageError(errors.New("run: no program given; usage: collgen run -n N -- CMD [ARGS...]"))
			}
			if grace < 0 {
				return usageError(fmt.Errorf("run: --grace %v: want 0 (SIGKILL at once) or more", grace))
			}
			if grace == 0 && cmd.Flags().Changed("grace") {
				grace = time.Nanosecond // launch reads 0 as its default
			}
			if runID != "" {
				if err := rendezvous.CheckRunID(runID); err != nil {
					return usageError(fmt.Errorf("run: --run-id: %w", err))
				}
			}
			cfg := launch.Config{N: n, Args: args, Store: store, Stdout: io.Out, Stderr: io.Err, Grace: grace,
				Nodes: nodes, NodeRank: nodeRank, RunID: runID}
			if nodes < 1 || nodeRank < 0 || nodeRank >= nodes {
				return usageError(fmt.Errorf("run: --node-rank %d of --nnodes %d: want 0 <= node-rank < nnodes", nodeRank, nodes))
			}
			if nodes > 1 && (store == "" || runID == "") {
				return usageError(fmt.Errorf("run: --nnodes %d needs --store (an etcd:// or tcp:// address every host reaches) and --run-id (the same on every host)", nodes))
			}
			if err := launch.CheckNodes(cfg); err != nil {
				return usageError(fmt.Errorf("run: %w", err))
			}
			if store != "" {
				scheme, rest, err := rendezvous.ParseStoreAddr(store)
				if err == nil && storeChecks[scheme] != nil {
					err = storeChecks[scheme](rest)
				}
				if err != nil {
					return usageError(fmt.Errorf("run: --store: %w", err))
				}
			} else {
				secret := os.Getenv(rendezvous.EnvSecret)
				if secret == "" {
					var b [16]byte
					rand.Read(b[:])
					secret = hex.EncodeToString(b[:])
				}
				srv, err := rendezvous.NewTCPServer("127.0.0.1:0", rendezvous.ServerOptions{
					Secret: []byte(secret),
					Logf:   func(f string, a ...any) { fmt.Fprintf(io.Err, "collgen run: "+f+"\n", a...) },
				})
				if err != nil {
					return fmt.Errorf("run: start the store: %w", err)
				}
				defer srv.Close()
				cfg.Store, cfg.Secret = "tcp://"+srv.Addr(), secret
			}

			sigs := make(chan os.Signal, 2)
			// SIGHUP (a dropped ssh session, a closed terminal) and SIGQUIT
			// (Ctrl-\, to see where ranks hang) are forwarded like SIGTERM,
			// not left to kill the launcher and its ranks without a grace.
			notifyNotIgnored(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
			defer signal.Stop(sigs)
			// A signal while ranks are starting cancels the start; once
			// the group runs it is forwarded to every rank. Every signal
			// is forwarded once, through forward: one that arrives before
			// the group is published waits in unsent, sent when it is (the
			// start may have completed anyway). Forwarded from two places
			// (the handler, and run after a signal it saw cancel the
			// start), one signal in that window went twice, and a second
			// forward is SIGKILL at once, without the grace period.
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			var (
				fwdMu  sync.Mutex
				group  *launch.Group
				unsent []os.Signal
			)
			forward := func(sig os.Signal) {
				fwdMu.Lock()
				defer fwdMu.Unlock()
				if group == nil {
					unsent = append(unsent, sig)
					return
				}
				group.Signal(sig)
			}
			done := make(chan struct{})
			defer close(done)
			go func() {
				for {
					select {
					case sig := <-sigs:
						fmt.Fprintf(io.Err, "collgen run: %s: stopping all ranks\n", launch.SignalName(sig))
						cancel(signalError{sig})
						forward(sig)
					case <-done:
						return
					}
				}
			}()
			g, err := launch.StartContext(ctx, cfg)
			if err != nil {
				var se signalError
				if errors.As(context.Cause(ctx), &se) {
					return &ExitError{Code: se.exitCode()}
				}
				return fmt.Errorf("run: %w", err)
			}
			fwdMu.Lock()
			group = g
			for _, sig := range unsent { // arrived between the start and now
				g.Signal(sig)
			}
			unsent = nil
			fwdMu.Unlock()
			if runStarted != nil {
				runStarted()
			}
			err = g.Wait()
			var ee *launch.ExitError
			if errors.As(err, &ee) {
				// launch (or the signal handler) has already said why.
				return &ExitError{Code: ee.Code}
			}
			return err
		},
	}
	cmd.Flags().IntVarP(&n, "nproc", "n", 0, "number of ranks to start (required, at most 1024)")
	cmd.Flags().StringVar(&store, "store", "", "existing store for the ranks: tcp://host:port, file:///path or etcd://host:port (default: serve one)")
	cmd.Flags().IntVar(&nodes, "nnodes", 1, "number of hosts, each running its own collgen run with the same -n, --store and --run-id")
	cmd.Flags().IntVar(&nodeRank, "node-rank", 0, "this host's index (0..nnodes-1): it starts ranks node-rank*N to node-rank*N+N-1")
	cmd.Flags().StringVar(&runID, "run-id", "", "the run's id, 8-16 letters and digits, the same on every host (default: a fresh one; required with --nnodes > 1)")
	cmd.Flags().DurationVar(&grace, "grace", launch.DefaultGrace, "time between SIGTERM and SIGKILL when stopping ranks")
	// Everything from CMD on belongs to CMD, "--" or not.
	cmd.Flags().SetInterspersed(false)
	return cmd
}

// runStarted, when set (by tests), is called once the ranks run and a
// signal is forwarded to them as it arrives.
var runStarted func()

// signalError is the cause of a start cancelled by a signal.
type signalError struct{ sig os.Signal }

func (e signalError) Error() string { return "interrupted by " + launch.SignalName(e.sig) }

// exitCode is the shell's status for a process ended by the signal.
func (e signalError) exitCode() int { return 128 + int(e.sig.(syscall.Signal)) }
