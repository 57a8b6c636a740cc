package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/runtime/cuda"
)

func init() { register("cache", newCmdCache) }

func newCmdCache(io *IO) *cobra.Command {
	var dir, prune string
	var clear bool
	cmd := &cobra.Command{
		Use:   "cache [--dir DIR] [--prune AGE | --clear]",
		Short: "Show or prune the cache of kernels NVRTC compiled",
		Long: `Cache reports the kernel cache that comm.New fills when it compiles the
generated kernels with NVRTC (no fatbin): its directory, entries, size and
last uses. Nothing evicts entries by itself: every NVRTC version, option
set, architecture and regenerated library adds its own (about 147 a
library and architecture). --prune AGE removes the entries not used for
AGE (a Go duration, or days as 30d) with their lock files; --clear removes
every entry. Removing is always safe: a missing entry is compiled again.
Lock files of compiles in progress are kept.

The directory is $COLLGEN_CACHE_DIR, else $XDG_CACHE_HOME/collgen, else
~/.cache/collgen; --dir names another.`,
		Example: `  collgen cache
  collgen cache --prune 30d
  collgen cache --dir /shared/collgen-cache --clear`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if clear && prune != "" {
				return usageError(fmt.Errorf("cache: --prune and --clear exclude each other"))
			}
			var age time.Duration
			if prune != "" {
				var err error
				if age, err = parseAge(prune); err != nil {
					return usageError(fmt.Errorf("cache: --prune: %w", err))
				}
			}
			if dir == "" {
				var err error
				if dir, err = cuda.DefaultCacheDir(); err != nil {
					return fmt.Errorf("cache: %w", err)
				}
			}
			c := &cuda.Cache{Dir: dir}
			if clear || prune != "" {
				cutoff := time.Now()
				if !clear {
					cutoff = cutoff.Add(-age)
				}
				removed, err := c.Prune(cutoff)
				what := "every entry"
				if !clear {
					what = "entries unused for " + prune
				}
				fmt.Fprintf(io.Out, "removed %s: %d entries (%.1f MiB), %d lock files, %d temporary files\n", what,
					removed.Entries, float64(removed.Bytes)/(1<<20), removed.Locks, removed.Temps)
				if err != nil {
					return fmt.Errorf("cache: %w", err)
				}
			}
			u, err := c.Usage()
			if err != nil {
				return fmt.Errorf("cache: %w", err)
			}
			fmt.Fprintf(io.Out, "%s: %s\n", dir, u)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the cache directory (default: $COLLGEN_CACHE_DIR, else $XDG_CACHE_HOME/collgen, else ~/.cache/collgen)")
	f.StringVar(&prune, "prune", "", "remove the entries not used for AGE (a Go duration such as 720h, or days: 30d)")
	f.BoolVar(&clear, "clear", false, "remove every entry")
	return cmd
}

// parseAge reads a non-negative Go duration, or a whole number of days
// ("30d").
func parseAge(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		d, err := strconv.Atoi(n)
		if err != nil || d < 0 || d > 100000 {
			return 0, fmt.Errorf("%q: want a Go duration (720h) or whole days (30d)", s)
		}
		return time.Duration(d) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q: want a Go duration (720h) or whole days (30d)", s)
	}
	return d, nil
}
