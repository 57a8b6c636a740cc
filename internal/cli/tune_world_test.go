package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/spec"
)

// TestTuneWorldKeepsSymmetricRules: `collgen tune --world N --out`
// on a topology whose select is given per world size (as the shipped
// spec's is) keeps world size N's symmetric rules, as the per-world --out
// does: a sweep of staged inputs says nothing about inputs read in place.
func TestTuneWorldKeepsSymmetricRules(t *testing.T) {
	dir := t.TempDir()
	specFile := filepath.Join(dir, "s.yaml")
	err := os.WriteFile(specFile, []byte(`version: 1
package: p
topologies:
  nv:
    kind: nvlink_full
    world_sizes: [2, 4]
    generate: {allreduce: [oneshot, oneshot_ll]}
    select:
      allreduce:
        2:
          - {upto: 64KiB, use: oneshot_ll}
          - {symmetric: true, use: oneshot}
          - {use: nccl}
        4: [{use: nccl}]
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var csv strings.Builder
	csv.WriteString("backend,collective,algorithm,dtype,op,world,bytes,iters,median_us\n")
	for b := 1024; b <= 1<<20; b *= 4 {
		fmt.Fprintf(&csv, "gpu,allreduce,oneshot_ll,bf16,sum,2,%d,10,%d\n", b, b/1024+5)
		fmt.Fprintf(&csv, "gpu,allreduce,oneshot,bf16,sum,2,%d,10,%d\n", b, b/512+9)
		fmt.Fprintf(&csv, "gpu,allreduce,nccl,bf16,sum,2,%d,10,%d\n", b, b/2048+20)
	}
	sweep := filepath.Join(dir, "w2.csv")
	if err := os.WriteFile(sweep, []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, world := range []bool{false, true} {
		out := filepath.Join(dir, fmt.Sprintf("tuned-%v.yaml", world))
		args := []string{"tune", "-q", "--from", sweep, "--spec", specFile, "--topology", "nv", "--out", out}
		if world {
			args = append(args, "--world", "2")
		}
		var stdout, stderr bytes.Buffer
		if rc := Do(args, nil, &stdout, &stderr); rc != 0 {
			t.Fatalf("collgen %s: exit %d\n%s%s", strings.Join(args, " "), rc, stdout.String(), stderr.String())
		}
		s, err := spec.Load(out)
		if err != nil {
			t.Fatal(err)
		}
		rules := s.Topology("nv").SelectByWorld[coll.AllReduce][2]
		found := false
		for _, r := range rules {
			found = found || r.Symmetric && r.Use == "oneshot"
		}
		if !found {
			data, _ := os.ReadFile(out)
			t.Errorf("--world given: %v: world 2's rules %v lost {symmetric: true, use: oneshot}:\n%s", world, rules, data)
		}
	}
}
