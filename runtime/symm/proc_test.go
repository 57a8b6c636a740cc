//go:build linux && (amd64 || arm64)

package symm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// Child-process protocol: the test binary re-executes itself with
// SYMM_TEST_CHILD set to a mode; TestMain then runs childMain instead of
// the tests. The child prints "ready" on stdout when its collective set-up
// is done, and "ok" or "error: ..." on stderr at the end.
const (
	envChild = "SYMM_TEST_CHILD"
	envRank  = "SYMM_TEST_RANK"
	envWorld = "SYMM_TEST_WORLD"
	envStore = "SYMM_TEST_STORE"
	envGroup = "SYMM_TEST_GROUP"
	envKill  = "SYMM_TEST_KILL_AT" // testHook point at which the child SIGKILLs itself
)

const procBytes = 1 << 16

// childModes are child modes that other test files register (the GPU
// tests' process ranks); they run instead of the host-twin set-up.
var childModes = map[string]func(rank, world int, st rendezvous.Store, group string) error{}

func TestMain(m *testing.M) {
	if mode := os.Getenv(envChild); mode != "" {
		os.Exit(childMain(mode))
	}
	os.Exit(m.Run())
}

func childMain(mode string) int {
	err := childRun(mode)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return 3
	}
	fmt.Fprintln(os.Stderr, "ok")
	return 0
}

func childRun(mode string) error {
	rank, _ := strconv.Atoi(os.Getenv(envRank))
	world, _ := strconv.Atoi(os.Getenv(envWorld))
	if at := os.Getenv(envKill); at != "" {
		testHook = func(_ int, point string) {
			if point == at {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
	}
	st, err := rendezvous.NewFileStore(os.Getenv(envStore))
	if err != nil {
		return err
	}
	defer st.Close()
	if f := childModes[mode]; f != nil {
		return f(rank, world, st, os.Getenv(envGroup))
	}
	rdvTimeout := 30 * time.Second
	if mode == "rdv-survivor" {
		rdvTimeout = 3 * time.Second
	}
	p, b, h, err := procSetup(st, os.Getenv(envGroup), rank, world, rdvTimeout)
	if err != nil {
		return err
	}
	defer p.Close()
	fmt.Println("ready")
	switch mode {
	case "peers":
		if err := procPeers(h, b); err != nil {
			return err
		}
		return b.Free()
	case "victim":
		select {} // killed by the parent
	case "survivor":
		return h.Barrier(Now, 1, 5*time.Second)
	case "rdv-survivor":
		return errors.New("the rendezvous succeeded without rank 2")
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// procSetup forms the pool, allocates, rendezvouses (within rdvTimeout)
// and passes one barrier, as every process rank does first. Forming the
// pool gets 30s: processes of a loaded machine may take seconds to start.
func procSetup(st rendezvous.Store, group string, rank, world int, rdvTimeout time.Duration) (*Pool, *Buffer, *Handle, error) {
	p, err := NewPool(context.Background(), Config{Group: group, Rank: rank, WorldSize: world, Store: st, Timeout: 30 * time.Second})
	if err != nil {
		return nil, nil, nil, err
	}
	b, err := p.Alloc(procBytes)
	if err == nil {
		var h *Handle
		ctx, cancel := context.WithTimeout(context.Background(), rdvTimeout)
		defer cancel()
		if h, err = p.Rendezvous(ctx, b); err == nil {
			if err = h.Barrier(Now, 0, 0); err == nil {
				return p, b, h, nil
			}
		}
	}
	p.Close()
	return nil, nil, nil, err
}

// procPeers has every rank fill its own buffer and write a byte into every
// peer's, then checks, after a barrier, what it reads from every peer.
func procPeers(h *Handle, b *Buffer) error {
	r, w := h.Rank(), h.WorldSize()
	mem := b.Bytes()
	for i := 0; i < procBytes/2; i++ {
		mem[i] = byte(r + 1)
	}
	for q := range w {
		h.PeerBytes(q)[procBytes/2+r] = byte(100 + r)
	}
	if err := h.Barrier(Now, 0, 0); err != nil {
		return err
	}
	for q := range w {
		pm := h.PeerBytes(q)
		if pm[0] != byte(q+1) || pm[procBytes/2-1] != byte(q+1) {
			return fmt.Errorf("rank %d reads rank %d's buffer as %d, want %d", r, q, pm[0], q+1)
		}
		if mem[procBytes/2+q] != byte(100+q) {
			return fmt.Errorf("rank %d: rank %d's write to this buffer reads %d", r, q, mem[procBytes/2+q])
		}
	}
	return h.Barrier(Now, 0, 0)
}

type child struct {
	cmd    *osexec.Cmd
	ready  chan struct{}
	stderr *bytes.Buffer
	done   chan error
}

// startChild runs rank of the group as a process of the test binary.
func startChild(t *testing.T, mode, dir, group string, rank, world int, env ...string) *child {
	t.Helper()
	cmd := osexec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+mode, envRank+"="+strconv.Itoa(rank), envWorld+"="+strconv.Itoa(world),
		envStore+"="+dir, envGroup+"="+group)
	cmd.Env = append(cmd.Env, env...)
	c := &child{cmd: cmd, ready: make(chan struct{}), stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	cmd.Stderr = c.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(c.ready)
			}
		}
		c.done <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	return c
}

// wait returns the child's exit error and stderr, failing the test if it
// runs for more than a minute.
func (c *child) wait(t *testing.T) (error, string) {
	t.Helper()
	select {
	case err := <-c.done:
		return err, strings.TrimSpace(c.stderr.String())
	case <-time.After(time.Minute):
		c.cmd.Process.Kill()
		t.Fatalf("rank process %d hangs", c.cmd.Process.Pid)
		return nil, ""
	}
}

// warmUp creates and closes a pool, so that descriptors the Go runtime
// opens once (the network poller's) exist before a test counts them.
func warmUp(t *testing.T) {
	t.Helper()
	p := newPools(t, 1, nil)[0]
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestProcessRanks runs a group of three ranks: this process and two
// children, exchanging memfd descriptors over fdpass.
func TestProcessRanks(t *testing.T) {
	const world = 3
	warmUp(t)
	before, shm := countResources(t), shmEntries(t)
	dir := filepath.Join(t.TempDir(), "store")
	group := uniqueGroup(t)
	kids := []*child{startChild(t, "peers", dir, group, 1, world), startChild(t, "peers", dir, group, 2, world)}
	st, err := rendezvous.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, b, h, err := procSetup(st, group, 0, world, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := procPeers(h, b); err != nil {
		t.Error(err)
	}
	if err := p.Close(); err != nil {
		t.Error(err)
	}
	st.Close()
	for r, k := range kids {
		if err, out := k.wait(t); err != nil || out != "ok" {
			t.Errorf("rank %d: %v: %s", r+1, err, out)
		}
	}
	if !eventually(func() bool { return countResources(t) == before }) {
		t.Errorf("after Close: %+v; before: %+v", countResources(t), before)
	}
	if got := shmEntries(t); len(got) != len(shm) {
		t.Errorf("/dev/shm holds %v, before %v", got, shm)
	}
}

// TestKilledRankMidBarrier SIGKILLs rank 2 while ranks 0 (this process)
// and 1 wait for it in a barrier. Both survivors must fail with a
// TimeoutError naming rank 2 and the channel, and this process must hold
// no descriptor or mapping of the group once it frees and closes.
func TestKilledRankMidBarrier(t *testing.T) {
	const world, victim = 3, 2
	const timeout = 5 * time.Second
	warmUp(t)
	before := countResources(t)
	dir := filepath.Join(t.TempDir(), "store")
	group := uniqueGroup(t)
	survivor := startChild(t, "survivor", dir, group, 1, world)
	dead := startChild(t, "victim", dir, group, victim, world)
	st, err := rendezvous.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, b, h, err := procSetup(st, group, 0, world, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	<-dead.ready
	<-survivor.ready
	res := make(chan error, 1)
	go func() { res <- h.Barrier(Now, 1, timeout) }()
	if err := dead.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var berr error
	select {
	case berr = <-res:
	case <-time.After(timeout + time.Minute):
		t.Fatal("the barrier outlived its deadline by a minute")
	}
	var te *TimeoutError
	if !errors.As(berr, &te) || te.Peer != victim || te.Channel != 1 || te.Rank != 0 {
		t.Errorf("rank 0: %v; want a TimeoutError naming rank %d on channel 1", berr, victim)
	}
	err, out := survivor.wait(t)
	if err == nil || !strings.Contains(out, "no signal from rank 2") || !strings.Contains(out, "channel 1") {
		t.Errorf("rank 1: %v: %s; want a timeout naming rank 2 and channel 1", err, out)
	}
	var ee *osexec.ExitError
	if err, _ := dead.wait(t); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("victim: %v, want killed by SIGKILL", err)
	}
	if err := b.Free(); err != nil {
		t.Error(err)
	}
	if err := p.Close(); err != nil {
		t.Error(err)
	}
	st.Close()
	if !eventually(func() bool { return countResources(t) == before }) {
		t.Errorf("after Close: %+v; before: %+v", countResources(t), before)
	}
}

// TestKilledRankMidRendezvous SIGKILLs rank 2 after it mapped its peers'
// memory and before it reported so. Ranks 0 (this process) and 1 must fail
// within their deadline naming rank 2, and this process must hold nothing
// of the group afterwards: the offered descriptor and the mappings already
// made are released on the failure path.
func TestKilledRankMidRendezvous(t *testing.T) {
	const world, victim = 3, 2
	warmUp(t)
	before := countResources(t)
	dir := filepath.Join(t.TempDir(), "store")
	group := uniqueGroup(t)
	survivor := startChild(t, "rdv-survivor", dir, group, 1, world)
	dead := startChild(t, "victim", dir, group, victim, world, envKill+"=rdv:mapped")
	st, err := rendezvous.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, _, _, err = procSetup(st, group, 0, world, 3*time.Second)
	var mre *rendezvous.MissingRanksError
	// Rank 2 is missing; on a badly loaded machine rank 1 may be late too.
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &mre) || !slices.Contains(mre.Missing, victim) {
		t.Errorf("rank 0: %v; want a timeout naming rank %d", err, victim)
	}
	if err, out := survivor.wait(t); err == nil || !strings.Contains(out, "missing rank 2") && !strings.Contains(out, "missing ranks 0, 2") {
		t.Errorf("rank 1: %v: %s; want a timeout naming rank 2", err, out)
	}
	var ee *osexec.ExitError
	if err, _ := dead.wait(t); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("victim: %v, want killed by SIGKILL", err)
	}
	st.Close()
	if !eventually(func() bool { return countResources(t) == before }) {
		t.Errorf("after the failed rendezvous: %+v; before: %+v", countResources(t), before)
	}
}
