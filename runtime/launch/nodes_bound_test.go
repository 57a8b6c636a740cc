package launch

import (
	"errors"
	"strings"
	"testing"
)

// TestHugeNodeCountRefused: a node count whose world (N × Nodes) passes
// what a rank can take (rendezvous.MaxWorldSize) is refused by CheckNodes
// and Start with ErrInvalidArgument naming the node count, before any rank
// starts. Before, N × Nodes overflowed: `collgen run -n 8 --nnodes
// 2305843009213693952` started ranks with COLLGEN_WORLD_SIZE=0.
func TestHugeNodeCountRefused(t *testing.T) {
	for _, nodes := range []int{1 << 61, (1<<20)/8 + 1} {
		cfg, out, _ := config(8, "env")
		cfg.Nodes, cfg.NodeRank, cfg.RunID = nodes, 0, "abcdefgh1"
		if err := CheckNodes(cfg); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "nodes") {
			t.Errorf("CheckNodes with %d nodes of 8 ranks: %v; want ErrInvalidArgument naming the nodes", nodes, err)
		}
		g, err := Start(cfg)
		if err == nil {
			g.Wait()
			t.Errorf("Start with %d nodes of 8 ranks started them; ranks saw:\n%s", nodes, out.String())
		} else if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Start with %d nodes of 8 ranks: %v; want ErrInvalidArgument", nodes, err)
		}
	}
}
