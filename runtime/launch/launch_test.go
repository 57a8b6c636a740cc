package launch

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
			if want := "collgen run: rank 2 exited with status 7; stopping the other ranks\n"; errb.String() != want {
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
	if !errors.As(err, &ee) || ee.Code != 130 || ee.Rank != -1 || err.Error() != "interrupted by interrupt; stopped all ranks" {
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
