//go:build linux

package rendezvous

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hugeWorld is a world size from a typo (WORLD_SIZE=10000000000).
const hugeWorld = 10_000_000_000

// TestReadEnvRefusesHugeWorld: a world size above MaxWorldSize in the
// environment is refused by ReadEnv with ErrInvalidArgument naming it.
// Before, ReadEnv returned it, and the first rendezvous made one key per
// rank (a fatal out-of-memory).
func TestReadEnvRefusesHugeWorld(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"collgen":  {"COLLGEN_RANK": "0", "COLLGEN_WORLD_SIZE": "10000000000", "COLLGEN_STORE": "tcp://h:1"},
		"torchrun": {"RANK": "0", "WORLD_SIZE": "10000000000", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
	} {
		_, err := readEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "10000000000") {
			t.Errorf("%s: ReadEnv with world size 10000000000: %v; want ErrInvalidArgument naming it", name, err)
		}
	}
}

// TestCollectivesRefuseHugeWorld: Join, Barrier, AllGather and the
// forgets refuse a world size above MaxWorldSize with ErrInvalidArgument
// naming it, at once. Before, each made one key per rank first: the
// process died ("fatal error: runtime: out of memory"), so the calls run
// in a child process whose address space is bounded.
func TestCollectivesRefuseHugeWorld(t *testing.T) {
	if os.Getenv("REVIEW_HUGE_WORLD_CHILD") == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "-race" && s.Value == "true" {
					t.Skip("the race detector's shadow memory needs an unbounded address space")
				}
			}
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestCollectivesRefuseHugeWorld$", "-test.v")
		cmd.Env = append(os.Environ(), "REVIEW_HUGE_WORLD_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			s := string(out)
			if len(s) > 2000 {
				s = s[:2000]
			}
			t.Fatalf("the child process failed (%v):\n%s", err, s)
		}
		return
	}
	// At most 8 GiB of address space, so an allocation per rank fails
	// fast instead of taking the machine's memory.
	lim := syscall.Rlimit{Cur: 8 << 30, Max: 8 << 30}
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &lim); err != nil {
		t.Fatal(err)
	}
	s := NewMemStore()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for name, call := range map[string]func() error{
		"Join":            func() error { return Join(ctx, s, "j", 0, hugeWorld) },
		"Barrier":         func() error { return Barrier(ctx, s, "b", 0, hugeWorld) },
		"AllGather":       func() error { _, err := AllGather(ctx, s, "a", 0, hugeWorld, nil); return err },
		"ForgetAllGather": func() error { return ForgetAllGather(ctx, s, "a", hugeWorld) },
		"ForgetBarrier":   func() error { return ForgetBarrier(ctx, s, "b", hugeWorld) },
	} {
		err := call()
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "10000000000") {
			t.Errorf("%s with world size %d: %v; want ErrInvalidArgument naming it", name, hugeWorld, err)
		}
	}
}
