package cli

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/runtime/rendezvous"
)

func init() { register("store", newCmdStore) }

// notifyNotIgnored is signal.Notify for the signals of sigs that this
// process did not start with ignored: Notify would undo the ignoring
// that nohup (SIGHUP) or a shell's background job (SIGINT, SIGQUIT) set
// up on purpose.
func notifyNotIgnored(c chan<- os.Signal, sigs ...os.Signal) {
	var on []os.Signal
	for _, s := range sigs {
		if !signal.Ignored(s) {
			on = append(on, s)
		}
	}
	if len(on) > 0 {
		signal.Notify(c, on...)
	}
}

func newCmdStore(io *IO) *cobra.Command {
	var listen, addrFile string
	var maxFrame int
	var insecure bool
	cmd := &cobra.Command{
		Use:   "store [--listen ADDR]",
		Short: "Serve a standalone rendezvous TCP store until interrupted",
		Long: `Store serves the TCP rendezvous store that ranks reach through
COLLGEN_STORE=tcp://host:port (or collgen run --store). It listens on
loopback unless --listen names another host; anything beyond loopback needs
COLLGEN_STORE_SECRET, which every rank must share (or --insecure, for a
trusted network only). Ctrl-C, SIGTERM or SIGHUP stops it.`,
		Example: `  collgen store --listen 127.0.0.1:29500
  COLLGEN_STORE_SECRET=... collgen store --listen 0.0.0.0:29500`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if maxFrame <= 0 {
				return usageError(fmt.Errorf("store: --max-frame-size %d: want a positive byte count (default %d)", maxFrame, rendezvous.DefaultMaxFrameSize))
			}
			sigs := make(chan os.Signal, 1)
			// SIGHUP (a dropped ssh session) stops it as Ctrl-C does, so
			// the address file goes with it; unless it was started with
			// SIGHUP ignored (nohup).
			notifyNotIgnored(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			defer signal.Stop(sigs)
			srv, err := rendezvous.NewTCPServer(listen, rendezvous.ServerOptions{
				MaxFrameSize: maxFrame,
				Insecure:     insecure,
				Logf:         func(f string, a ...any) { fmt.Fprintf(io.Err, "collgen store: "+f+"\n", a...) },
			})
			if err != nil {
				return err
			}
			defer srv.Close()
			addr := "tcp://" + srv.Addr()
			if addrFile != "" {
				// Write then rename so a script polling for the file never
				// reads half an address.
				if err := writeFileAtomic(addrFile, []byte(addr+"\n"), 0o600); err != nil {
					return fmt.Errorf("store: --addr-file: %w", err)
				}
				// A stopped store's address must not outlive it: a script
				// waiting for the file would dial a dead port.
				defer os.Remove(addrFile)
			}
			auth := "no secret"
			if os.Getenv(rendezvous.EnvSecret) != "" {
				auth = "secret from " + rendezvous.EnvSecret
			}
			fmt.Fprintf(io.Out, "collgen store: listening on %s (%s)\n", addr, auth)
			sig := <-sigs
			fmt.Fprintf(io.Out, "collgen store: %v: stopped\n", sig)
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:29500", "address to listen on; a bare :PORT means loopback")
	cmd.Flags().StringVar(&addrFile, "addr-file", "", "write the listening tcp:// address to this file once ready (useful with port 0); removed when the store stops")
	cmd.Flags().IntVar(&maxFrame, "max-frame-size", rendezvous.DefaultMaxFrameSize, "largest request in bytes; bigger ones disconnect the client")
	cmd.Flags().BoolVar(&insecure, "insecure", false, "allow listening beyond loopback without "+rendezvous.EnvSecret+" (anyone who can connect can read and change the store)")
	return cmd
}
