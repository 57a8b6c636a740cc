package cli

import (
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// TestGenScripts runs the generator's CLI scripts, testdata/script/gen_*.txtar.
// (TestMain, in run_test.go, maps the `collgen` command to Do.)
func TestGenScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{Files: globScripts(t, "testdata/script/gen_*.txtar")})
}
