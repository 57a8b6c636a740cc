package cli

import (
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestHostScripts runs the host backend's CLI scripts,
// testdata/script/host_*.txtar: `collgen bench --backend host` over
// processes, goroutines and `collgen run`.
func TestHostScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Files: globScripts(t, "testdata/script/host_*.txtar"),
		Setup: func(env *testscript.Env) error {
			for _, k := range []string{rendezvous.RankEnv, rendezvous.WorldSizeEnv, rendezvous.LocalRankEnv,
				rendezvous.StoreEnv, rendezvous.SecretEnv, "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} {
				env.Setenv(k, "")
			}
			return nil
		},
	})
}
