package cli

import (
	"os"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

// TestStoreNohup runs testdata/script/nohup_store.txtar:
// collgen store under nohup (SIGHUP ignored) must survive a SIGHUP.
func TestStoreNohup(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Files: []string{"testdata/script/nohup_store.txtar"},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			// waitfile FILE: wait up to 10s for FILE to exist.
			"waitfile": func(ts *testscript.TestScript, neg bool, args []string) {
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					if _, err := os.Stat(ts.MkAbs(args[0])); err == nil {
						return
					}
					if time.Now().After(deadline) {
						ts.Fatalf("%s did not appear within 10s", args[0])
					}
				}
			},
		},
	})
}
