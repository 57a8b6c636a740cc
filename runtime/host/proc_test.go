package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/shm"
)

// Child-process protocol: the test binary re-executes itself with
// COLLGEN_HOST_CHILD set; TestMain then runs childMain instead of the tests.
const (
	envChild   = "COLLGEN_HOST_CHILD"   // mode: "sweep", "wake" or "kill"
	envRank    = "COLLGEN_HOST_RANK"    //
	envWorld   = "COLLGEN_HOST_WORLD"   //
	envStore   = "COLLGEN_HOST_STORE"   // file store directory
	envGroup   = "COLLGEN_HOST_GROUP"   //
	envKillAt  = "COLLGEN_HOST_KILL_AT" // hook point at which this child SIGKILLs itself
	envStopAt  = "COLLGEN_HOST_STOP_AT" // hook point at which this child SIGSTOPs itself
	envTimeout = "COLLGEN_HOST_TIMEOUT" // Config.Timeout
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envChild); mode != "" {
		os.Exit(childMain(mode))
	}
	os.Exit(m.Run())
}

// childMain is one rank process. It prints "ok" or "error: ..." on stderr
// and exits 0 or 3.
func childMain(mode string) int {
	sharedInputs = false
	rank, _ := strconv.Atoi(os.Getenv(envRank))
	world, _ := strconv.Atoi(os.Getenv(envWorld))
	timeout, _ := time.ParseDuration(os.Getenv(envTimeout))
	if os.Getenv(envPatient) != "" {
		blockSlice, liveness = patience, patience
	}
	if at := os.Getenv(envKillAt); at != "" {
		testHook = func(r int, point string) {
			if point == at {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
	}
	if at := os.Getenv(envStopAt); at != "" {
		testHook = func(r int, point string) {
			if point == at {
				syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			}
		}
	}
	st, err := rendezvous.NewFileStore(os.Getenv(envStore))
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return 3
	}
	defer st.Close()
	cfg := Config{Rank: rank, WorldSize: world, Store: st, Group: os.Getenv(envGroup), Shared: true,
		Library: testLibrary, Timeout: timeout, Lanes: 2, SlotBytes: 2 * 8192}
	g, err := New(context.Background(), cfg)
	if err == nil {
		err = childRun(mode, g)
		if cerr := g.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return 3
	}
	fmt.Fprintln(os.Stderr, "ok")
	return 0
}

func childRun(mode string, g *Group) error {
	ctx := context.Background()
	switch mode {
	case "sweep":
		for _, o := range sweep([]int{1, 7, 1000, 5000}, g.WorldSize()) {
			if _, err := runOp(ctx, g, o); err != nil {
				return err
			}
		}
		return nil
	case "wake":
		return wakeRun(g)
	case "kill":
		if err := g.Setup(ctx); err != nil {
			return err
		}
		for i := 0; i < 3; i++ {
			if _, err := runOp(ctx, g, op{coll: coll.AllReduce, alg: coll.TwoShot, dtype: "f32", red: "sum", count: 4096, seed: i}); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown child mode %q", mode)
}

type childResult struct {
	rank   int
	err    error // from Wait
	stderr string
	took   time.Duration
}

// startChildren runs world rank processes of the test binary and waits.
func startChildren(t *testing.T, mode, group string, world int, timeout time.Duration, extra func(rank int) []string) []childResult {
	t.Helper()
	rs := startRanks(t, mode, group, world, timeout, extra)
	res := make([]childResult, world)
	for r := range res {
		res[r] = rs.wait(r)
	}
	return res
}

// rankProcs are running rank processes; wait(r) returns rank r's result
// once it has exited.
type rankProcs struct {
	cmds []*osexec.Cmd
	res  []childResult
	done []chan struct{}
}

func (rs *rankProcs) wait(r int) childResult {
	<-rs.done[r]
	return rs.res[r]
}

// startRanks starts world rank processes of the test binary. Any still
// running when the test ends are killed (a stopped one too).
func startRanks(t *testing.T, mode, group string, world int, timeout time.Duration, extra func(rank int) []string) *rankProcs {
	t.Helper()
	dir := t.TempDir()
	rs := &rankProcs{cmds: make([]*osexec.Cmd, world), res: make([]childResult, world), done: make([]chan struct{}, world)}
	for r := 0; r < world; r++ {
		cmd := osexec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envChild+"="+mode, envRank+"="+strconv.Itoa(r), envWorld+"="+strconv.Itoa(world),
			envStore+"="+filepath.Join(dir, "store"), envGroup+"="+group, envTimeout+"="+timeout.String())
		if extra != nil {
			cmd.Env = append(cmd.Env, extra(r)...)
		}
		stderr := &bytes.Buffer{}
		cmd.Stderr = stderr
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		rs.cmds[r], rs.done[r] = cmd, make(chan struct{})
		t.Cleanup(func() {
			select {
			case <-rs.done[r]:
			default:
				cmd.Process.Kill()
				<-rs.done[r]
			}
		})
		go func() {
			defer close(rs.done[r])
			err := cmd.Wait()
			rs.res[r] = childResult{rank: r, err: err, stderr: strings.TrimSpace(stderr.String()), took: time.Since(start)}
		}()
	}
	return rs
}

// onlyRank gives env (NAME=value) to rank r's process alone (startRanks'
// extra).
func onlyRank(r int, env string) func(rank int) []string {
	return func(rank int) []string {
		if rank == r {
			return []string{env}
		}
		return nil
	}
}

// leftovers returns the /dev/shm names of a group.
func leftovers(t *testing.T, group string, world int) []string {
	t.Helper()
	names, err := shm.Leftovers("", GroupHash(group, world))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func uniqueGroup(t *testing.T) string {
	return fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "."), os.Getpid(), time.Now().UnixNano())
}

// TestMultiProcessSweep runs the dtype x op x algorithm sweep on rank
// processes over POSIX shared memory.
func TestMultiProcessSweep(t *testing.T) {
	for _, w := range []int{2, 4} {
		group := uniqueGroup(t)
		for _, r := range startChildren(t, "sweep", group, w, 20*time.Second, nil) {
			if r.err != nil || r.stderr != "ok" {
				t.Errorf("w%d rank %d: %v: %s", w, r.rank, r.err, r.stderr)
			}
		}
		if l := leftovers(t, group, w); len(l) > 0 {
			t.Errorf("left in /dev/shm: %v", l)
		}
	}
}

// TestKillRankAtEachPhase SIGKILLs rank 1 of 3 at every set-up step and
// every phase of a two-shot all-reduce. The survivors must fail within
// their deadline with an error naming what went wrong, and /dev/shm must
// hold nothing of the group afterwards.
func TestKillRankAtEachPhase(t *testing.T) {
	points := []string{"setup:start", "setup:create", "setup:created", "setup:mapped", "setup:unlink", "setup:done", "phase:0", "phase:1", "phase:2"}
	const world, victim = 3, 1
	const timeout = 1500 * time.Millisecond
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			group := uniqueGroup(t)
			res := startChildren(t, "kill", group, world, timeout, onlyRank(victim, envKillAt+"="+point))
			for _, r := range res {
				if r.rank == victim {
					var ee *osexec.ExitError
					if !errors.As(r.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
						t.Errorf("victim: %v (%s), want killed by SIGKILL", r.err, r.stderr)
					}
					continue
				}
				if r.err == nil {
					t.Errorf("rank %d succeeded without rank %d", r.rank, victim)
				}
				want := "died"
				if strings.HasPrefix(point, "setup:") && point != "setup:unlink" && point != "setup:done" {
					want = "timeout"
				}
				// A survivor may learn of the death from the other
				// survivor's abort flag first.
				if !strings.Contains(r.stderr, want) && !(want == "died" && strings.Contains(r.stderr, "abandoned")) {
					t.Errorf("rank %d: %q, want an error containing %q", r.rank, r.stderr, want)
				}
				// Deadline: the timeout for the wait that failed, plus
				// process start-up and slack for a loaded CI machine.
				if r.took > timeout+5*time.Second {
					t.Errorf("rank %d took %v to fail", r.rank, r.took)
				}
				t.Logf("rank %d after %v: %s", r.rank, r.took.Round(time.Millisecond), r.stderr)
			}
			if l := leftovers(t, group, world); len(l) > 0 {
				t.Errorf("left in /dev/shm: %v", l)
			}
		})
	}
}

// TestStoppedRankTimesOut SIGSTOPs rank 1 of 3 at a set-up step and at a
// phase of a two-shot all-reduce (case 7 of docs/reliability.md). A
// stopped process is alive, so the survivors must fail with a timeout (or
// learn from the other survivor that it abandoned the collective), never
// "died", within their deadline; then the stopped rank is SIGKILLed and
// /dev/shm must hold nothing of the group.
func TestStoppedRankTimesOut(t *testing.T) {
	const world, victim = 3, 1
	const timeout = 1500 * time.Millisecond
	for _, point := range []string{"setup:created", "phase:1"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			group := uniqueGroup(t)
			rs := startRanks(t, "kill", group, world, timeout, onlyRank(victim, envStopAt+"="+point))
			for r := 0; r < world; r++ {
				if r == victim {
					continue
				}
				res := rs.wait(r)
				if res.err == nil {
					t.Errorf("rank %d succeeded without rank %d", r, victim)
				}
				if !strings.Contains(res.stderr, "timeout") && !strings.Contains(res.stderr, "abandoned") {
					t.Errorf("rank %d: %q, want a timeout", r, res.stderr)
				}
				if strings.Contains(res.stderr, "did not reach the barrier") && !strings.Contains(res.stderr, "ranks [1]") {
					t.Errorf("rank %d: %q, want the stopped rank named", r, res.stderr)
				}
				if strings.Contains(res.stderr, "died") {
					t.Errorf("rank %d: %q: a stopped rank is not dead", r, res.stderr)
				}
				if res.took > timeout+5*time.Second {
					t.Errorf("rank %d took %v to fail", r, res.took)
				}
				t.Logf("rank %d after %v: %s", r, res.took.Round(time.Millisecond), res.stderr)
			}
			select {
			case <-rs.done[victim]:
				t.Fatalf("the stopped rank exited: %+v", rs.res[victim])
			default:
			}
			if err := rs.cmds[victim].Process.Kill(); err != nil {
				t.Fatal(err)
			}
			if res := rs.wait(victim); res.err == nil {
				t.Errorf("victim exited cleanly after SIGKILL")
			}
			if l := leftovers(t, group, world); len(l) > 0 {
				t.Errorf("left in /dev/shm: %v", l)
			}
		})
	}
}

// TestSquattedSegmentRefused pre-creates rank 0's segment name (the nonce
// is forced through the store, as a squatter who learnt it would); set-up
// must refuse it, leave the squatter's file alone and leave nothing else;
// rank 1 fails at once naming rank 0 (ErrPeerFailed), not at its deadline.
func TestSquattedSegmentRefused(t *testing.T) {
	const world = 2
	group := uniqueGroup(t)
	st := rendezvous.NewMemStore()
	defer st.Close()
	st.Set(context.Background(), "collgen/host/"+group+"/nonce", []byte("feedface"))
	squat := shm.Posix{}.Path(SegmentName(group, world, "feedface", 0))
	if err := os.WriteFile(squat, []byte("not yours"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(squat)
	errs := goroutineGroup(t, world, Config{Store: st, Group: group, Shared: true, Timeout: 500 * time.Millisecond}, func(g *Group) error {
		return g.Setup(context.Background())
	})
	if !errors.Is(errs[0], shm.ErrExists) {
		t.Errorf("rank 0: %v, want shm.ErrExists", errs[0])
	}
	if !errors.Is(errs[1], ErrPeerFailed) || !strings.Contains(errs[1].Error(), "ranks [0] left") {
		t.Errorf("rank 1: %v, want ErrPeerFailed naming rank 0", errs[1])
	}
	if b, err := os.ReadFile(squat); err != nil || string(b) != "not yours" {
		t.Errorf("squatter's file touched: %q %v", b, err)
	}
	if l := leftovers(t, group, world); len(l) != 1 {
		t.Errorf("left in /dev/shm: %v, want only the squatter's", l)
	}
}

// TestNoLeaksAfterClose runs POSIX-backed groups on goroutine ranks and
// checks that goroutines, file descriptors, mappings and names are all
// gone after Close.
func TestNoLeaksAfterClose(t *testing.T) {
	countFDs := func() int { e, _ := os.ReadDir("/proc/self/fd"); return len(e) }
	countMaps := func() int {
		b, _ := os.ReadFile("/proc/self/maps")
		return strings.Count(string(b), "/"+shm.Prefix)
	}
	// Warm up anything lazily started (timers, store goroutines).
	goroutineGroup(t, 2, Config{Shared: true, Group: uniqueGroup(t)}, func(g *Group) error { return g.Setup(context.Background()) })
	time.Sleep(50 * time.Millisecond)
	g0, fd0, m0 := numGoroutines(), countFDs(), countMaps()
	group := uniqueGroup(t)
	errs := goroutineGroup(t, 4, Config{Shared: true, Group: group, Lanes: 4, SlotBytes: 4 * 4096}, func(g *Group) error {
		for i := 0; i < 10; i++ {
			if _, err := runOp(context.Background(), g, op{coll: coll.AllReduce, dtype: "f32", red: "sum", count: 20000 + i, seed: i}); err != nil {
				return err
			}
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for numGoroutines() > g0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g1 := numGoroutines(); g1 > g0 {
		t.Errorf("goroutines: %d before, %d after", g0, g1)
	}
	if fd1 := countFDs(); fd1 > fd0 {
		t.Errorf("fds: %d before, %d after", fd0, fd1)
	}
	if m1 := countMaps(); m1 > m0 {
		t.Errorf("shm mappings: %d before, %d after", m0, m1)
	}
	if l := leftovers(t, group, 4); len(l) > 0 {
		t.Errorf("left in /dev/shm: %v", l)
	}
}

// TestCloseEndsSetup: rank 0's set-up waits for rank 1, who never sets up;
// rank 0's Close (from another goroutine) returns at once and its set-up
// fails with ErrClosed. (Before, Close waited for set-up's whole timeout.)
func TestCloseEndsSetup(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			st := rendezvous.NewMemStore()
			defer st.Close()
			group := uniqueGroup(t)
			g, err := New(context.Background(), Config{Rank: 0, WorldSize: 2, Store: st, Group: group, Shared: shared,
				Library: testLibrary, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- g.Setup(context.Background()) }()
			time.Sleep(200 * time.Millisecond)
			start := time.Now()
			if err := g.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Close took %v with set-up waiting for a peer", d)
			}
			if err := <-done; !errors.Is(err, ErrClosed) {
				t.Errorf("Setup: %v; want ErrClosed", err)
			}
			if l := leftovers(t, group, 2); len(l) != 0 {
				t.Errorf("left behind: %v", l)
			}
		})
	}
}

// TestPeerClosedBeforeSetup: rank 1 closes its group without setting up;
// rank 0's set-up fails at once with ErrPeerFailed naming it, not at its
// deadline. So does a rank whose peer's own set-up step failed (see
// TestSquattedSegmentRefused).
func TestPeerClosedBeforeSetup(t *testing.T) {
	st := rendezvous.NewMemStore()
	defer st.Close()
	group := uniqueGroup(t)
	mk := func(r int) *Group {
		g, err := New(context.Background(), Config{Rank: r, WorldSize: 2, Store: st, Group: group, Library: testLibrary, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	g0, g1 := mk(0), mk(1)
	defer g0.Close()
	if err := g1.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := g0.Setup(context.Background())
	if !errors.Is(err, ErrPeerFailed) || !strings.Contains(err.Error(), "ranks [1] left") {
		t.Errorf("rank 0's set-up: %v; want ErrPeerFailed naming rank 1", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("rank 0's set-up took %v", d)
	}
}
