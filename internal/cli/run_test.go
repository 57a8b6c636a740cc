package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestMain lets the test binary act as the programs that scripts exec:
// "collgen" itself and "rankhelper", a tiny rank program for `collgen run`
// scripts. Other commands' scripts may add their own entries here.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"collgen":    func() { os.Exit(Do(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) },
		"rankhelper": func() { os.Exit(rankHelper(os.Args[1:])) },
	})
}

// TestRunScripts runs the `collgen run` and `collgen store` scripts,
// testdata/script/run_*.txtar.
func TestRunScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/script/run_*.txtar")
	if err != nil || len(files) == 0 {
		t.Fatalf("no run_*.txtar scripts: %v", err)
	}
	testscript.Run(t, testscript.Params{
		Files: files,
		Setup: func(env *testscript.Env) error {
			// Scripts must not inherit a rank environment or a secret.
			for _, k := range []string{rendezvous.EnvRank, rendezvous.EnvWorldSize, rendezvous.EnvLocalRank,
				rendezvous.EnvStore, rendezvous.EnvSecret, rendezvous.EnvRunID, "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} {
				env.Setenv(k, "")
			}
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			// gone FILE...: each FILE holds a path that must not exist.
			"gone": func(ts *testscript.TestScript, neg bool, args []string) {
				for _, f := range args {
					p := strings.TrimSpace(ts.ReadFile(f))
					_, err := os.Stat(p)
					if exists := err == nil; exists != neg {
						if exists {
							os.Remove(p)
						}
						ts.Fatalf("%s: exists=%v", p, exists)
					}
				}
			},
			// waitfile FILE...: wait up to 10s for every file to exist.
			"waitfile": func(ts *testscript.TestScript, neg bool, args []string) {
				deadline := time.Now().Add(10 * time.Second)
				for _, f := range args {
					for {
						if _, err := os.Stat(ts.MkAbs(f)); err == nil {
							break
						}
						if time.Now().After(deadline) {
							ts.Fatalf("%s did not appear within 10s", f)
						}
						time.Sleep(10 * time.Millisecond)
					}
				}
			},
		},
	})
}

// rankHelper is a rank program for scripts:
//
//	rankhelper env               print the rank environment
//	rankhelper fail R CODE       rank R exits CODE; the others hang
//	rankhelper sleep DIR         touch DIR/ready.RANK, then hang
//	rankhelper shmleak DIR       leave a /dev/shm segment of the run (path in DIR/seg.RANK), then SIGKILL itself
//	rankhelper gather            join, all-gather and barrier through the store
func rankHelper(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "rankhelper: no mode")
		return 2
	}
	rank := os.Getenv(rendezvous.EnvRank)
	switch args[0] {
	case "env":
		fmt.Printf("rank=%s world=%s local=%s store=%s secret-set=%v\n", rank, os.Getenv(rendezvous.EnvWorldSize),
			os.Getenv(rendezvous.EnvLocalRank), os.Getenv(rendezvous.EnvStore), os.Getenv(rendezvous.EnvSecret) != "")
		fmt.Fprintln(os.Stderr, "hello from stderr")
		return 0
	case "fail":
		if rank == args[1] {
			time.Sleep(200 * time.Millisecond)
			fmt.Println("failing")
			code, _ := strconv.Atoi(args[2])
			return code
		}
		time.Sleep(60 * time.Second)
		fmt.Println("not stopped")
		return 0
	case "shmleak":
		// As a rank killed during host set-up: a segment of this run left
		// in /dev/shm; its path goes to DIR/seg.RANK for the script.
		seg := "/dev/shm/collgen-0000000000000000-" + os.Getenv(rendezvous.EnvRunID) + ".leak-r" + rank
		if err := os.WriteFile(seg, nil, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "rankhelper:", err)
			return 1
		}
		os.WriteFile(filepath.Join(args[1], "seg."+rank), []byte(seg), 0o600)
		// Die once every rank has made its segment.
		world, _ := strconv.Atoi(os.Getenv(rendezvous.EnvWorldSize))
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if m, _ := filepath.Glob(filepath.Join(args[1], "seg.*")); len(m) >= world {
				break
			}
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case "sleep":
		os.WriteFile(filepath.Join(args[1], "ready."+rank), nil, 0o600)
		time.Sleep(60 * time.Second)
		return 0
	case "gather":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		env, s, err := rendezvous.FromEnv(ctx)
		if err == nil {
			defer s.Close()
			err = rendezvous.Join(ctx, s, "script", env.Rank, env.WorldSize)
		}
		var blobs [][]byte
		if err == nil {
			blobs, err = rendezvous.AllGather(ctx, s, "names", env.Rank, env.WorldSize, []byte("r"+rank))
		}
		if err == nil {
			err = rendezvous.Barrier(ctx, s, "done", env.Rank, env.WorldSize)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "rankhelper:", err)
			return 1
		}
		names := make([]string, len(blobs))
		for i, b := range blobs {
			names[i] = string(b)
		}
		fmt.Printf("gathered %s\n", strings.Join(names, " "))
		return 0
	}
	fmt.Fprintf(os.Stderr, "rankhelper: unknown mode %q\n", args[0])
	return 2
}
