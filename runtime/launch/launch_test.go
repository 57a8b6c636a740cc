package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/shm"
)

// The test binary doubles as the rank program: with LAUNCH_TEST_HELPER set
// it runs helper(os.Args[1:]) instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("LAUNCH_TEST_HELPER") != "" {
		os.Exit(helper(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func helper(args []string) int {
	rank, _ := strconv.Atoi(os.Getenv("COLLGEN_RANK"))
	switch args[0] {
	case "env":
		fmt.Printf("rank=%s world=%s local=%s store=%s secret=%s\n", os.Getenv("COLLGEN_RANK"), os.Getenv("COLLGEN_WORLD_SIZE"),
			os.Getenv("COLLGEN_LOCAL_RANK"), os.Getenv("COLLGEN_STORE"), os.Getenv("COLLGEN_STORE_SECRET"))
		fmt.Fprintf(os.Stderr, "to stderr\npartial")
		return 0
	case "fail", "fail-stubborn": // fail RANK CODE: that rank exits CODE, the others hang
		bad, _ := strconv.Atoi(args[1])
		code, _ := strconv.Atoi(args[2])
		if rank == bad {
			time.Sleep(100 * time.Millisecond)
			return code
		}
		if args[0] == "fail-stubborn" {
			signal.Ignore(syscall.SIGTERM)
		}
		fmt.Println("waiting")
		time.Sleep(30 * time.Second)
		return 0
	case "sleep":
		fmt.Println("ready")
		time.Sleep(30 * time.Second)
		return 0
	case "killed-then-fail": // killed-then-fail VICTIM DIR: the victim is SIGKILLed, then the others exit 1
		victim, _ := strconv.Atoi(args[1])
		mark := filepath.Join(args[2], "dying")
		if rank == victim {
			os.WriteFile(mark, nil, 0o600)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		// As survivors that notice a dead peer: fail just after it died.
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(mark); err == nil {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		fmt.Fprintln(os.Stderr, "peer gone")
		return 1
	case "stopped": // stopped DIR: rank 1 SIGSTOPs itself, then rank 0 fails
		mark := filepath.Join(args[1], "stopping")
		if rank == 1 {
			os.WriteFile(mark, nil, 0o600)
			syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			time.Sleep(60 * time.Second) // continued without a signal: hang
			return 0
		}
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(mark); err == nil {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		return 3
	case "shm": // shm DIR: leave a segment of this run (and one of another run) in DIR, then die
		name := fmt.Sprintf("collgen-0011223344556677-%s.ab-r%d", os.Getenv("COLLGEN_RUN_ID"), rank)
		os.WriteFile(filepath.Join(args[1], name), nil, 0o600)
		if rank == 0 {
			os.WriteFile(filepath.Join(args[1], "collgen-0011223344556677-otherrun1.ab-r0"), nil, 0o600)
		}
		os.MkdirAll(strings.TrimPrefix(os.Getenv("COLLGEN_STORE"), "file://")+"/run-"+os.Getenv("COLLGEN_RUN_ID"), 0o700)
		// Die once every rank has made its segment (4 with the other run's;
		// the launcher's run record is not one).
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if m, _ := filepath.Glob(filepath.Join(args[1], "collgen-*")); len(m) >= 4 {
				break
			}
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case "launcher": // launcher N PIDFILE: a collgen run of N sleeping ranks whose pids go to PIDFILE
		n, _ := strconv.Atoi(args[1])
		exe, _ := os.Executable()
		g, err := Start(Config{N: n, Args: []string{exe, "pid", args[2]}, Env: os.Environ(), Store: "tcp://127.0.0.1:1"})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		g.Wait()
		return 0
	case "pid": // pid FILE: append our pid to FILE, then sleep
		f, _ := os.OpenFile(args[1], os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
		fmt.Fprintln(f, os.Getpid())
		f.Close()
		time.Sleep(60 * time.Second)
		return 0
	}
	return 99
}

func config(n int, args ...string) (Config, *syncBuffer, *syncBuffer) {
	exe, _ := os.Executable()
	var out, errb syncBuffer
	return Config{
		N:      n,
		Args:   append([]string{exe}, args...),
		Env:    append(os.Environ(), "LAUNCH_TEST_HELPER=1", "COLLGEN_RANK=stale"),
		Store:  "tcp://127.0.0.1:1234",
		Secret: "sek",
		Stdout: &out,
		Stderr: &errb,
		Grace:  300 * time.Millisecond,
	}, &out, &errb
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func sortedLines(s string) string {
	l := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	sort.Strings(l)
	return strings.Join(l, "\n")
}

func TestEnvAndPrefixes(t *testing.T) {
	cfg, out, errb := config(3, "env")
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	want := `[rank 0] rank=0 world=3 local=0 store=tcp://127.0.0.1:1234 secret=sek
[rank 1] rank=1 world=3 local=1 store=tcp://127.0.0.1:1234 secret=sek
[rank 2] rank=2 world=3 local=2 store=tcp://127.0.0.1:1234 secret=sek`
	if got := sortedLines(out.String()); got != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s", got, want)
	}
	wantErr := `[rank 0] partial
[rank 0] to stderr
[rank 1] partial
[rank 1] to stderr
[rank 2] partial
[rank 2] to stderr`
	if got := sortedLines(errb.String()); got != wantErr {
		t.Fatalf("stderr:\n%s\nwant:\n%s", got, wantErr)
	}
}

func TestFailureStopsOthers(t *testing.T) {
	for _, mode := range []string{"fail", "fail-stubborn"} {
		t.Run(mode, func(t *testing.T) {
			cfg, _, errb := config(4, mode, "2", "7")
			start := time.Now()
			g, err := Start(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = g.Wait()
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("group took %v to stop", d)
			}
			var ee *ExitError
			if !errors.As(err, &ee) || ee.Rank != 2 || ee.Code != 7 || err.Error() != "rank 2 exited with status 7" {
				t.Fatalf("Wait = %#v (%v), want rank 2 status 7", err, err)
			}
			if want := "collgen run: rank 2 exited with status 7; stopping the other ranks\n" +
				"collgen run: ranks 0, 1 and 3 stopped after rank 2 failed; their errors follow from that\n"; errb.String() != want {
				t.Fatalf("stderr = %q, want %q", errb.String(), want)
			}
		})
	}
}

func TestSignalStopsAll(t *testing.T) {
	cfg, out, _ := config(2, "sleep")
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); strings.Count(out.String(), "ready") < 2; {
		if time.Now().After(deadline) {
			t.Fatal("ranks did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	g.Signal(os.Interrupt)
	err = g.Wait()
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 130 || ee.Rank != -1 || err.Error() != "interrupted by SIGINT; stopped all ranks" {
		t.Fatalf("Wait = %v, want an interrupt with code 130", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("stopping took %v", d)
	}
}

func TestStartErrors(t *testing.T) {
	cfg, _, _ := config(2)
	cfg.Args = []string{"/nonexistent/prog"}
	_, err := Start(cfg)
	if ok, _ := regexp.MatchString(`^launch: start rank 0: fork/exec /nonexistent/prog: no such file or directory$`, fmt.Sprint(err)); !ok {
		t.Fatalf("got %v", err)
	}
	cfg.N = 0
	if _, err := Start(cfg); fmt.Sprint(err) != "launch: 0 ranks: want at least 1" {
		t.Fatalf("got %v", err)
	}
}

func TestPrefixWriterLongAndSplitLines(t *testing.T) {
	var out bytes.Buffer
	p := &prefixWriter{mu: &sync.Mutex{}, w: &out, prefix: "[rank 1] "}
	p.Write([]byte("ab"))
	p.Write([]byte("c\nd\n\nx"))
	p.flush()
	if want := "[rank 1] abc\n[rank 1] d\n[rank 1] \n[rank 1] x\n"; out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
	out.Reset()
	p.Write(bytes.Repeat([]byte("y"), maxLine+10))
	p.flush()
	if n := strings.Count(out.String(), "[rank 1] "); n != 2 {
		t.Fatalf("long line split into %d pieces, want 2", n)
	}
}

// TestKilledRankIsTheCause: rank 2 is SIGKILLed and the others exit 1
// because of it, possibly reaped first. The report names rank 2 and the
// signal by name, and lists the others as consequences.
func TestKilledRankIsTheCause(t *testing.T) {
	cfg, _, errb := config(4, "killed-then-fail", "2", t.TempDir())
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = g.Wait()
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Rank != 2 || ee.Signal != syscall.SIGKILL || ee.Code != 137 {
		t.Fatalf("Wait = %v, want rank 2 killed by SIGKILL", err)
	}
	if err.Error() != "rank 2 was killed by SIGKILL" {
		t.Fatalf("message %q", err)
	}
	if !strings.Contains(errb.String(), "collgen run: rank 2 was killed by SIGKILL; stopping the other ranks\n") {
		t.Fatalf("stderr:\n%s", errb)
	}
	if fmt.Sprint(ee.Stopped) != "[0 1 3]" {
		t.Fatalf("Stopped = %v, want [0 1 3]", ee.Stopped)
	}
}

func TestSignalName(t *testing.T) {
	for sig, want := range map[os.Signal]string{syscall.SIGKILL: "SIGKILL", syscall.SIGTERM: "SIGTERM", os.Interrupt: "SIGINT", syscall.Signal(77): "signal 77"} {
		if got := SignalName(sig); got != want {
			t.Errorf("SignalName(%d) = %q, want %q", sig, got, want)
		}
	}
}

// TestTooManyRanks: an absurd -n is refused before anything starts.
func TestTooManyRanks(t *testing.T) {
	cfg, _, _ := config(100000, "env")
	start := time.Now()
	_, err := Start(cfg)
	if !errors.Is(err, ErrTooManyRanks) || !strings.Contains(err.Error(), "100000 ranks, at most 1024") {
		t.Fatalf("Start = %v, want ErrTooManyRanks", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("refusing took %v", d)
	}
}

// TestCancelDuringStart: a cancelled context stops starting ranks, and the
// ones started are reaped.
func TestCancelDuringStart(t *testing.T) {
	cfg, _, _ := config(3, "sleep")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := StartContext(ctx, cfg); !errors.Is(err, context.Canceled) {
		t.Fatalf("StartContext = %v, want context.Canceled", err)
	}
}

// TestSweepAfterKilledRanks: ranks killed after creating shared-memory
// segments (as during host set-up) and file-store keys leave nothing of
// their run once Wait returns; another run's segment stays.
func TestSweepAfterKilledRanks(t *testing.T) {
	shmDir, storeDir := t.TempDir(), t.TempDir()
	cfg, _, errb := config(3, "shm", shmDir)
	cfg.ShmDir, cfg.Store, cfg.RunID = shmDir, "file://"+storeDir, "testrun42"
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(); err == nil {
		t.Fatal("killed ranks succeeded")
	}
	left, _ := os.ReadDir(shmDir)
	if len(left) != 1 || left[0].Name() != "collgen-0011223344556677-otherrun1.ab-r0" {
		t.Fatalf("left in shm dir: %v (the run's record goes too)", left)
	}
	if _, err := os.Stat(filepath.Join(storeDir, "run-testrun42")); !os.IsNotExist(err) {
		t.Fatalf("run directory of the file store survived: %v", err)
	}
	if !strings.Contains(errb.String(), "removed 3 shared-memory segment(s)") {
		t.Fatalf("stderr:\n%s", errb)
	}
}

// TestNoOrphansWhenLauncherKilled: SIGKILL the launcher; its ranks die too
// (parent-death signal).
func TestNoOrphansWhenLauncherKilled(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "launcher", "2", pidFile)
	cmd.Env = append(os.Environ(), "LAUNCH_TEST_HELPER=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); len(pids) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("ranks did not start")
		}
		b, _ := os.ReadFile(pidFile)
		pids = pids[:0]
		for _, f := range strings.Fields(string(b)) {
			p, _ := strconv.Atoi(f)
			pids = append(pids, p)
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	for _, pid := range pids {
		deadline := time.Now().Add(5 * time.Second)
		// The ranks are the launcher's children, reparented on its death
		// and reaped by init (or a subreaper): gone means kill(pid, 0)
		// fails or the process is a zombie.
		for !goneOrZombie(pid) {
			if time.Now().After(deadline) {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("rank pid %d outlived its launcher", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// goneOrZombie reports whether pid has exited (or is a zombie).
func goneOrZombie(pid int) bool {
	if syscall.Kill(pid, 0) == syscall.ESRCH {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// TestStaleRunsRemoved: run directories that launchers killed before they
// could clean up left in a file store are removed by the next launcher on
// the host; a live launcher's run and directories of unknown origin stay.
func TestStaleRunsRemoved(t *testing.T) {
	store := t.TempDir()
	host, _ := os.Hostname()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	runs := map[string]string{
		"run-dead0001": fmt.Sprintf("%s %d\n", host, dead.Process.Pid),
		"run-live0001": fmt.Sprintf("%s %d\n", host, os.Getpid()),
		"run-else0001": fmt.Sprintf("otherhost %d\n", dead.Process.Pid),
		"run-anon0001": "",
	}
	for name, owner := range runs {
		os.MkdirAll(filepath.Join(store, name), 0o700)
		os.WriteFile(filepath.Join(store, name, "k.a2V5"), []byte("stale"), 0o600)
		if owner != "" {
			os.WriteFile(filepath.Join(store, name, launcherFile), []byte(owner), 0o600)
		}
	}
	cfg, _, errb := config(1, "env")
	cfg.Store = "file://" + store
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rendezvous.RunDir(store, g.RunID())); err != nil {
		t.Fatalf("this run's directory: %v", err)
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	var left []string
	ents, _ := os.ReadDir(store)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if fmt.Sprint(left) != "[run-anon0001 run-else0001 run-live0001]" {
		t.Fatalf("left in the store: %v", left)
	}
	if !strings.Contains(errb.String(), "removed 1 stale run(s) of launchers that are gone from the store: run-dead0001") {
		t.Fatalf("stderr:\n%s", errb)
	}
}

// TestStoppedRankStoppedPromptly: a SIGSTOPped rank gets SIGCONT with the
// launcher's SIGTERM, so it ends by that SIGTERM at once instead of by
// SIGKILL after the (here 30 s) grace period; the report names rank 0.
func TestStoppedRankStoppedPromptly(t *testing.T) {
	cfg, _, errb := config(2, "stopped", t.TempDir())
	cfg.Grace = 30 * time.Second
	start := time.Now()
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = g.Wait()
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Rank != 0 || ee.Code != 3 || fmt.Sprint(ee.Stopped) != "[1]" {
		t.Fatalf("Wait = %v (stopped %v), want rank 0 status 3 with rank 1 stopped", err, ee)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("the stopped rank was ended after %v (the grace period is 30s)\n%s", d, errb)
	}
}

// TestSweepAfterKilledLauncher: a launcher killed before its own sweep
// leaves its run's segments and its run record; the next launcher sweeps
// them. Records of a live launcher, of another pid namespace and malformed
// ones are left alone, with their segments.
func TestSweepAfterKilledLauncher(t *testing.T) {
	shmDir := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	ns := shm.PIDNamespace()
	if ns == 0 {
		t.Skip("no pid namespace to read")
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(shmDir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for run, rec := range map[string]string{
		"deadrun1":  fmt.Sprintf("%d %d\n", ns, dead.Process.Pid),
		"liverun1":  fmt.Sprintf("%d %d\n", ns, os.Getpid()),
		"otherns01": fmt.Sprintf("%d %d\n", ns+1, dead.Process.Pid),
		"garbage01": "not a record",
	} {
		write("collgen.run-"+run, rec)
		write(fmt.Sprintf("collgen-0011223344556677-%s.ab-r0", run), "")
	}
	cfg, _, errb := config(1, "env")
	cfg.ShmDir, cfg.RunID = shmDir, "nextrun1"
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	var left []string
	ents, _ := os.ReadDir(shmDir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := []string{
		"collgen-0011223344556677-garbage01.ab-r0", "collgen-0011223344556677-liverun1.ab-r0", "collgen-0011223344556677-otherns01.ab-r0",
		"collgen.run-garbage01", "collgen.run-liverun1", "collgen.run-otherns01",
	}
	if strings.Join(left, " ") != strings.Join(want, " ") {
		t.Errorf("left:\n%v\nwant:\n%v", left, want)
	}
	if !strings.Contains(errb.String(), "removed 1 shared-memory segment(s) of 1 run(s) whose launcher was killed") {
		t.Errorf("stderr:\n%s", errb)
	}
}

// TestConfigErrorsAreInvalidArgument: every Config that Start refuses
// before starting anything, other than one too large for the host
// (ErrTooManyRanks), matches ErrInvalidArgument, and CheckNodes' refusals
// too, with the message alone (no repeated sentinel text); they were
// plain errors a program could not tell from a failed start.
func TestConfigErrorsAreInvalidArgument(t *testing.T) {
	for name, mod := range map[string]func(*Config){
		"no ranks":        func(c *Config) { c.N = 0 },
		"no program":      func(c *Config) { c.Args = nil },
		"bad run id":      func(c *Config) { c.RunID = "no/slashes" },
		"node rank":       func(c *Config) { c.Nodes, c.NodeRank = 2, 2 },
		"negative nodes":  func(c *Config) { c.Nodes = -1 },
		"multi-node file": func(c *Config) { c.Nodes, c.RunID, c.Store = 2, "abcdefgh", "file:///tmp/x" },
		"multi-node no id": func(c *Config) {
			c.Nodes, c.RunID, c.Store = 2, "", "tcp://127.0.0.1:1"
		},
	} {
		cfg, _, _ := config(2, "env")
		mod(&cfg)
		_, err := Start(cfg)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: Start = %v; want an error matching ErrInvalidArgument", name, err)
		} else if strings.Contains(err.Error(), ErrInvalidArgument.Error()) {
			t.Errorf("%s: %q repeats the sentinel's text", name, err)
		}
		if strings.HasPrefix(name, "node") || strings.HasPrefix(name, "multi") || name == "negative nodes" {
			if err := CheckNodes(cfg); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("%s: CheckNodes = %v; want an error matching ErrInvalidArgument", name, err)
			}
		}
	}
}
