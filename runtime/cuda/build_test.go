package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeCompiler stands in for NVRTC: it sleeps, records every compile
// (counts, peak concurrency, and optionally a line in a shared log file
// for tests across processes) and returns "image of <name>".
type fakeCompiler struct {
	delay time.Duration
	fail  string // a program name that fails to compile
	log   string // file to append each compiled name to ("" none)

	mu      sync.Mutex
	counts  map[string]int
	running int
	peak    int
}

func (f *fakeCompiler) compile(ctx context.Context, req CompileRequest) ([]byte, error) {
	f.mu.Lock()
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	f.counts[req.Name]++
	f.running++
	f.peak = max(f.peak, f.running)
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.running--; f.mu.Unlock() }()
	time.Sleep(f.delay)
	if f.log != "" {
		lf, err := os.OpenFile(f.log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, err
		}
		fmt.Fprintln(lf, req.Name)
		lf.Close()
	}
	if req.Name == f.fail {
		return nil, &CompileError{Name: req.Name, Arch: req.Arch, Result: "NVRTC_ERROR_COMPILATION", Log: "error: fake"}
	}
	return fakeImage(req.Name), nil
}

func fakeImage(name string) []byte { return []byte("\x7fELF image of " + name) }

func (f *fakeCompiler) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.counts {
		n += c
	}
	return n
}

// fakeRequests are n programs with distinct names and sources.
func fakeRequests(n int) []CompileRequest {
	reqs := make([]CompileRequest, n)
	for i := range reqs {
		name := fmt.Sprintf("k%02d.cu", i)
		reqs[i] = CompileRequest{Name: name, Source: "// " + name, Arch: 90}
	}
	return reqs
}

// checkImages fails unless every request got its own image.
func checkImages(t *testing.T, reqs []CompileRequest, built []Built) {
	t.Helper()
	if len(built) != len(reqs) {
		t.Fatalf("%d images for %d requests", len(built), len(reqs))
	}
	for i, b := range built {
		if string(b.Image) != string(fakeImage(reqs[i].Name)) {
			t.Fatalf("request %d (%s): image %q", i, reqs[i].Name, b.Image)
		}
	}
}

func newFakeBuilder(dir string, f *fakeCompiler, workers, start int) *Builder {
	var c *Cache
	if dir != "" {
		c = &Cache{Dir: dir}
	}
	return &Builder{Cache: c, Workers: workers, Compile: f.compile, Compiler: "fake 1", Start: start}
}

// TestBuilderParallelAndWarm: a cold build compiles every program once,
// Workers at a time; a second build over the same cache compiles nothing.
func TestBuilderParallelAndWarm(t *testing.T) {
	dir := t.TempDir()
	reqs := fakeRequests(12)
	f := &fakeCompiler{delay: 30 * time.Millisecond}
	cold := newFakeBuilder(dir, f, 4, 0)
	built, err := cold.Build(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	checkImages(t, reqs, built)
	// Each program counts once (it was looked up twice: before and
	// after taking its lock).
	if st := cold.Cache.Stats(); st != (CacheStats{Misses: int64(len(reqs))}) {
		t.Errorf("cold build stats %+v; want %d misses", st, len(reqs))
	}
	for i, b := range built {
		if !b.Compiled {
			t.Errorf("cold build: request %d not compiled", i)
		}
	}
	if f.total() != len(reqs) || f.peak != 4 {
		t.Fatalf("cold build: %d compiles, peak %d at once; want %d and 4", f.total(), f.peak, len(reqs))
	}
	warm := &fakeCompiler{}
	warmB := newFakeBuilder(dir, warm, 4, 5)
	built, err = warmB.Build(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	checkImages(t, reqs, built)
	if warm.total() != 0 {
		t.Fatalf("warm build compiled %d programs, want 0", warm.total())
	}
	if st := warmB.Cache.Stats(); st != (CacheStats{Hits: int64(len(reqs))}) {
		t.Errorf("warm build stats %+v; want %d hits", st, len(reqs))
	}
	for i, b := range built {
		if b.Compiled {
			t.Errorf("warm build: request %d compiled", i)
		}
	}
}

// TestBuilderSharesWorkInProcess: ranks of one process (goroutines), each
// with its own Builder over one cache directory, compile each program
// once between them.
func TestBuilderSharesWorkInProcess(t *testing.T) {
	dir := t.TempDir()
	reqs := fakeRequests(16)
	f := &fakeCompiler{delay: 20 * time.Millisecond}
	const ranks = 4
	var wg sync.WaitGroup
	errs := make([]error, ranks)
	for r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			built, err := newFakeBuilder(dir, f, 2, r*len(reqs)/ranks).Build(context.Background(), reqs)
			if err == nil && len(built) != len(reqs) {
				err = fmt.Errorf("%d images", len(built))
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if n := f.counts[r.Name]; n != 1 {
			t.Errorf("%s compiled %d times, want once", r.Name, n)
		}
	}
}

// TestBuilderSharesWorkAcrossProcesses: processes filling one cache
// directory at once compile each program once between them, and each
// gets every image.
func TestBuilderSharesWorkAcrossProcesses(t *testing.T) {
	reqs := fakeRequests(24)
	if dir := os.Getenv("COLLGEN_BUILD_TEST_CHILD"); dir != "" {
		var start int
		fmt.Sscan(os.Getenv("COLLGEN_BUILD_TEST_START"), &start)
		f := &fakeCompiler{delay: 40 * time.Millisecond, log: filepath.Join(dir, "compiled.log")}
		built, err := newFakeBuilder(filepath.Join(dir, "cache"), f, 3, start).Build(context.Background(), reqs)
		if err != nil {
			t.Fatal(err)
		}
		checkImages(t, reqs, built)
		return
	}
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := t.TempDir()
	RunTestChildren(t, "TestBuilderSharesWorkAcrossProcesses", 3, func(i int) []string {
		return []string{"COLLGEN_BUILD_TEST_CHILD=" + dir, fmt.Sprintf("COLLGEN_BUILD_TEST_START=%d", i*8)}
	})
	data, err := os.ReadFile(filepath.Join(dir, "compiled.log"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, l := range strings.Fields(string(data)) {
		seen[l]++
	}
	for _, r := range reqs {
		if seen[r.Name] != 1 {
			t.Errorf("%s compiled %d times across the processes, want once", r.Name, seen[r.Name])
		}
	}
}

// RunTestChildren runs n copies of this test binary at once, each running
// only test, with env(i) added to child i's environment, and fails t for
// each child that fails. (Exported for cuda_test's tests across processes.)
func RunTestChildren(t *testing.T, test string, n int, env func(i int) []string) {
	t.Helper()
	var cmds []*exec.Cmd
	for i := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
		cmd.Env = append(os.Environ(), env(i)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child %d: %v", i, err)
		}
	}
}

// TestBuilderWaitsForHeldLock: a program whose lock another holder has is
// put aside, then read from the cache once the holder has written it:
// this Builder never compiles it.
func TestBuilderWaitsForHeldLock(t *testing.T) {
	dir := t.TempDir()
	reqs := fakeRequests(3)
	c := &Cache{Dir: dir}
	key := c.keyFor(reqs[1], "fake 1")
	unlock, err := c.lock(context.Background(), key, false)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeCompiler{}
	done := make(chan error, 1)
	var built []Built
	go func() {
		var err error
		built, err = newFakeBuilder(dir, f, 2, 0).Build(context.Background(), reqs)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Build returned while the lock was held: %v", err)
	default:
	}
	if err := c.Put(key, fakeImage(reqs[1].Name)); err != nil {
		t.Fatal(err)
	}
	unlock()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Build still waiting 10 s after the lock was released")
	}
	checkImages(t, reqs, built)
	if f.counts[reqs[1].Name] != 0 || built[1].Compiled {
		t.Fatalf("the held program was compiled here (%d times)", f.counts[reqs[1].Name])
	}
}

// TestBuilderHolderDiesWithoutWriting: when the holder gives the lock up
// without writing the entry (it failed or died), the waiter compiles it.
func TestBuilderHolderDiesWithoutWriting(t *testing.T) {
	dir := t.TempDir()
	reqs := fakeRequests(2)
	c := &Cache{Dir: dir}
	unlock, err := c.lock(context.Background(), c.keyFor(reqs[0], "fake 1"), false)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, unlock)
	f := &fakeCompiler{}
	built, err := newFakeBuilder(dir, f, 2, 0).Build(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	checkImages(t, reqs, built)
	if f.counts[reqs[0].Name] != 1 {
		t.Fatalf("program compiled %d times after the holder gave up, want once", f.counts[reqs[0].Name])
	}
}

// TestBuilderCancelWhileWaiting: waiting for a lock ends with the context,
// with the context's error, and releases nothing it does not hold.
func TestBuilderCancelWhileWaiting(t *testing.T) {
	dir := t.TempDir()
	reqs := fakeRequests(1)
	c := &Cache{Dir: dir}
	unlock, err := c.lock(context.Background(), c.keyFor(reqs[0], "fake 1"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err = newFakeBuilder(dir, &fakeCompiler{}, 1, 0).Build(ctx, reqs)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
	if el := time.Since(t0); el > 5*time.Second {
		t.Fatalf("Build returned %v after the deadline", el)
	}
	if _, err := c.lock(context.Background(), c.keyFor(reqs[0], "fake 1"), false); !errors.Is(err, errLocked) {
		t.Fatalf("the lock is no longer held by its owner: %v", err)
	}
}

// TestBuilderCompileError: a failing program is a *BuildError naming it
// (its index and name) over the *CompileError, and stops the build.
func TestBuilderCompileError(t *testing.T) {
	reqs := fakeRequests(20)
	f := &fakeCompiler{fail: reqs[0].Name}
	_, err := newFakeBuilder(t.TempDir(), f, 1, 0).Build(context.Background(), reqs)
	var be *BuildError
	var ce *CompileError
	if !errors.As(err, &be) || !errors.As(err, &ce) {
		t.Fatalf("err = %v (%T), want a *BuildError over a *CompileError", err, err)
	}
	if be.Index != 0 || be.Name != reqs[0].Name || !strings.Contains(err.Error(), reqs[0].Name) {
		t.Fatalf("BuildError names %d %q: %v", be.Index, be.Name, err)
	}
	if n := f.total(); n > 2 {
		t.Fatalf("%d programs compiled after the first failed, want the build stopped", n-1)
	}
}

// TestBuilderUnusableCache: a cache directory that cannot be created only
// costs the sharing; with no cache at all every program is compiled.
func TestBuilderUnusableCache(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	reqs := fakeRequests(4)
	for _, dir := range []string{filepath.Join(file, "cache"), ""} {
		f := &fakeCompiler{}
		built, err := newFakeBuilder(dir, f, 2, 0).Build(context.Background(), reqs)
		if err != nil {
			t.Fatalf("cache %q: %v", dir, err)
		}
		checkImages(t, reqs, built)
		if f.total() != len(reqs) {
			t.Fatalf("cache %q: %d compiles, want %d", dir, f.total(), len(reqs))
		}
	}
}

// TestBuilderKeySeparatesCompilers: images of different compilers (or
// versions) never answer for each other.
func TestBuilderKeySeparatesCompilers(t *testing.T) {
	var c Cache
	r := fakeRequests(1)[0]
	if c.keyFor(r, "nvrtc 12.8") == c.keyFor(r, "nvrtc 13.0") {
		t.Fatal("same key for two NVRTC versions")
	}
}

// TestBuilderLockReleasedWhenContextEnds: a lock taken just as the
// context ends (Build's context cancelled by another program's failure,
// a caller's deadline) is given back. It was kept, with its file open,
// until the garbage collector closed the file: other processes and this
// one waited for that program meanwhile.
func TestBuilderLockReleasedWhenContextEnds(t *testing.T) {
	dir := t.TempDir()
	req := fakeRequests(1)[0]
	b := newFakeBuilder(dir, &fakeCompiler{}, 1, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, wait := range []bool{false, true} {
		if _, err := b.one(ctx, req, wait); !errors.Is(err, context.Canceled) {
			t.Fatalf("wait %v: err = %v, want the context's", wait, err)
		}
		unlock, err := b.Cache.lock(context.Background(), b.Cache.keyFor(req, "fake 1"), false)
		if err != nil {
			t.Fatalf("wait %v: the program's lock is still held after one returned: %v", wait, err)
		}
		unlock()
	}
}

// TestBuilderLockWaitBounded: a holder that keeps a program's lock (a
// process stopped by SIGSTOP or a debugger keeps its flock) holds a
// Builder without a deadline only for LockWait; the program is then
// compiled here, and the holder's lock is left alone.
func TestBuilderLockWaitBounded(t *testing.T) {
	dir := t.TempDir()
	reqs := fakeRequests(2)
	c := &Cache{Dir: dir}
	key := c.keyFor(reqs[0], "fake 1")
	unlock, err := c.lock(context.Background(), key, false)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	f := &fakeCompiler{}
	b := newFakeBuilder(dir, f, 2, 0)
	b.LockWait = 200 * time.Millisecond
	done := make(chan error, 1)
	var built []Built
	t0 := time.Now()
	go func() {
		var err error
		built, err = b.Build(context.Background(), reqs)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Build still waits for the held lock 20 s later (LockWait 200 ms)")
	}
	if el := time.Since(t0); el < b.LockWait {
		t.Fatalf("Build returned after %v, before LockWait", el)
	}
	checkImages(t, reqs, built)
	if f.counts[reqs[0].Name] != 1 || !built[0].Compiled {
		t.Fatalf("held program compiled %d times here, want once", f.counts[reqs[0].Name])
	}
	if _, err := c.lock(context.Background(), key, false); !errors.Is(err, errLocked) {
		t.Fatalf("the holder's lock was taken from it: %v", err)
	}
}

// TestBuilderHugeStart: Start is taken modulo the programs; near MaxInt
// it wrapped negative and indexed out of range (a panic).
func TestBuilderHugeStart(t *testing.T) {
	reqs := fakeRequests(3)
	for _, start := range []int{math.MaxInt, math.MaxInt - 1, -5, 4} {
		built, err := newFakeBuilder("", &fakeCompiler{}, 1, start).Build(context.Background(), reqs)
		if err != nil {
			t.Fatalf("Start %d: %v", start, err)
		}
		checkImages(t, reqs, built)
	}
}
