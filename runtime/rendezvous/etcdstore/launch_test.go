package etcdstore_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/launch"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// rankEnv makes the test binary act as one rank of TestLaunchAcrossNodes.
const rankEnv = "ETCDSTORE_TEST_RANK"

func TestMain(m *testing.M) {
	if os.Getenv(rankEnv) != "" {
		os.Exit(rankMain())
	}
	os.Exit(m.Run())
}

// rankMain is a rank as a user's program is one: FromEnv (the etcd://
// address), Join, then an all-gather of where every rank sits.
func rankMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env, s, err := rendezvous.FromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	if err := rendezvous.Join(ctx, s, "g", env.Rank, env.WorldSize); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	all, err := rendezvous.AllGather(ctx, s, "where", env.Rank, env.WorldSize, []byte(fmt.Sprintf("%d/%d", env.Rank, env.LocalRank)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("world=%d all=%s\n", env.WorldSize, bytes.Join(all, []byte(",")))
	return 0
}

// TestLaunchAcrossNodes starts a run spanning two "nodes" as `collgen run
// --nnodes 2 --node-rank I --run-id ID --store etcd://...` does on each
// host: two launchers of two ranks each, rendezvousing through etcd; every
// rank sees the same world of four with global and local ranks.
func TestLaunchAcrossNodes(t *testing.T) {
	ep := startEtcd(t)
	var outs, errs [2]bytes.Buffer
	var groups [2]*launch.Group
	for node := range 2 {
		g, err := launch.Start(launch.Config{N: 2, Args: []string{os.Args[0]}, Env: append(os.Environ(), rankEnv+"=1"),
			Store: "etcd://" + ep, RunID: "acrossnodes1", Nodes: 2, NodeRank: node,
			Stdout: &outs[node], Stderr: &errs[node], ShmDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		groups[node] = g
	}
	for node, g := range groups {
		if err := g.Wait(); err != nil {
			t.Fatalf("node %d: %v\n%s", node, err, errs[node].String())
		}
	}
	got := outs[0].String() + outs[1].String()
	for r := range 4 {
		want := fmt.Sprintf("[rank %d] world=4 all=0/0,1/1,2/0,3/1\n", r)
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
