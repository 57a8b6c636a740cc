package rendezvous

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// FuzzEnv: any rank environment, collgen's or torchrun's, reads to a rank
// inside its world and a store address with a port that exists (1-65535
// for a collgen address; torchrun's rank 0 may serve on 0, any free port),
// or an error; never a panic. MASTER_PORT 65535 under torchelastic made
// the store port 65536.
func FuzzEnv(f *testing.F) {
	f.Add("0", "2", "", "tcp://127.0.0.1:29500", "", "", "", "", false)
	f.Add("", "", "", "", "3", "4", "node0", "29500", true)
	f.Add("", "", "", "", "0", "2", "h", "65535", true)
	f.Add("5", "2", "-1", "file:///tmp/x", "", "", "", "", false)
	f.Fuzz(func(t *testing.T, rank, world, local, store, trank, tworld, maddr, mport string, elastic bool) {
		env := map[string]string{EnvRank: rank, EnvWorldSize: world, EnvLocalRank: local, EnvStore: store,
			"RANK": trank, "WORLD_SIZE": tworld, "MASTER_ADDR": maddr, "MASTER_PORT": mport}
		if elastic {
			env["TORCHELASTIC_RUN_ID"] = "r"
		}
		e, err := readEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			return
		}
		if e.Rank < 0 || e.Rank >= e.WorldSize {
			t.Fatalf("rank %d of world %d accepted from %v", e.Rank, e.WorldSize, env)
		}
		if e.Source == "torchrun" { // rank 0 serves it: port 0 picks one
			_, port, err := net.SplitHostPort(strings.TrimPrefix(e.Store, "tcp://"))
			if p, perr := strconv.Atoi(port); err != nil || perr != nil || p < 0 || p > 65535 {
				t.Fatalf("store %q from %v: port %q", e.Store, env, port)
			}
			return
		}
		scheme, rest, err := ParseStoreAddr(e.Store)
		if err != nil {
			t.Fatalf("store %q from %v does not parse: %v", e.Store, env, err)
		}
		if scheme == "tcp" {
			_, port, err := net.SplitHostPort(rest)
			if p, perr := strconv.Atoi(port); err != nil || perr != nil || p < 1 || p > 65535 {
				t.Fatalf("store %q from %v: port %q", e.Store, env, port)
			}
		}
	})
}
