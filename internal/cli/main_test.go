package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// TestGenScripts runs the generator's CLI scripts, testdata/script/gen_*.txtar.
// (TestMain, in run_test.go, maps the `collgen` command to Do.) Scripts get
// $REPO, this module's root, and the Go caches of the test's environment,
// offline, so a script can build a generated package against this
// checkout ([short] skips that).
func TestGenScripts(t *testing.T) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	goEnv := func(k string) string {
		out, err := exec.Command("go", "env", k).Output()
		if err != nil {
			return os.Getenv(k)
		}
		return strings.TrimSpace(string(out))
	}
	cache, modcache := goEnv("GOCACHE"), goEnv("GOMODCACHE")
	testscript.Run(t, testscript.Params{
		Files: globScripts(t, "testdata/script/gen_*.txtar"),
		Setup: func(env *testscript.Env) error {
			env.Setenv("REPO", repo)
			env.Setenv("GOCACHE", cache)
			env.Setenv("GOMODCACHE", modcache)
			env.Setenv("GOPROXY", "off")
			env.Setenv("GOTOOLCHAIN", "local")
			return nil
		},
		Condition: func(cond string) (bool, error) {
			if cond == "short" {
				return testing.Short(), nil
			}
			return false, nil
		},
	})
}
