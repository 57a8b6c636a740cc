//go:build cgo

package dl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenRefcountAndSymbols(t *testing.T) {
	s := Spec{Lib: "libm", Sonames: []string{"libm.so.6"}, Hint: "install libm"}
	a, err := Open(s)
	if err != nil {
		t.Skipf("no libm.so.6: %v", err)
	}
	b, err := Open(s)
	if err != nil || b != a || a.refs != 2 {
		t.Fatalf("second open: %v, same library %v, refs %d", err, b == a, a.refs)
	}
	if a.Sym("cos") == nil || a.Sym("cuInit") != nil {
		t.Error("symbol lookup: want cos present, cuInit absent")
	}
	var le *LibraryError
	if err := a.Missing("cuInit", "not a usable CUDA driver library"); !errors.As(err, &le) || le.Symbol != "cuInit" || le.Lib != "libm" || !strings.HasSuffix(err.Error(), "; install libm") {
		t.Errorf("Missing: %v", err)
	}
	if a.Close() != nil || a.refs != 1 || b.Close() != nil {
		t.Fatal("close")
	}
	if err := a.Close(); err == nil {
		t.Error("a third Close of two opens succeeded")
	}
}

// TestFileOfSoname: a library opened by a bare soname, which the dynamic
// linker searched for, names the file it was loaded from (the NVRTC
// cache key identifies the library by that file).
func TestFileOfSoname(t *testing.T) {
	l, err := Open(Spec{Lib: "libm", Sonames: []string{"libm.so.6"}})
	if err != nil {
		t.Skipf("no libm.so.6: %v", err)
	}
	defer l.Close()
	f := l.File("cos")
	if st, err := os.Stat(f); !filepath.IsAbs(f) || err != nil || st.IsDir() || !strings.HasPrefix(filepath.Base(f), "libm") {
		t.Errorf("File(cos) of %s = %q (%v); want libm's absolute path", l.Path, f, err)
	}
	if f := l.File("collgen_no_such_symbol"); f != "" {
		t.Errorf("File of a missing symbol = %q, want \"\"", f)
	}
}

func TestCandidatesAndErrors(t *testing.T) {
	dir := t.TempDir()
	s := Spec{Lib: "libfoo", Env: "COLLGEN_TEST_FOO", Sonames: []string{"libfoo.so.1", "libfoo.so"}, Dirs: []string{dir}, Extra: []string{"/x/libfoo.so.9"}, Hint: "set COLLGEN_TEST_FOO"}
	if got := strings.Join(s.Candidates(), " "); got != "libfoo.so.1 libfoo.so /x/libfoo.so.9" {
		t.Errorf("candidates %q", got)
	}
	t.Setenv("COLLGEN_TEST_FOO", dir)
	if got := strings.Join(s.Candidates(), " "); got != dir+"/libfoo.so.1 "+dir+"/libfoo.so" {
		t.Errorf("directory override: %q", got)
	}
	t.Setenv("COLLGEN_TEST_FOO", "/nonexistent/libfoo.so.1")
	_, err := Open(s)
	var le *LibraryError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "cannot load libfoo (tried /nonexistent/libfoo.so.1)") || !strings.HasSuffix(err.Error(), "; set COLLGEN_TEST_FOO") {
		t.Errorf("got %v", err)
	}
}

// TestOpenReasonIsItsOwn: the reason of a failed open is dlerror's text
// for that open, read in the same C call (dlerror's state is per thread,
// and a goroutine may change threads between two cgo calls: the reason
// could come back empty, "not found", or another open's). Under load
// from many goroutines every error names its own path. The old code
// passed this too most of the time: the race needs a thread switch
// between the two calls.
func TestOpenReasonIsItsOwn(t *testing.T) {
	errs := make(chan error, 64)
	for i := range cap(errs) {
		go func() {
			path := fmt.Sprintf("%s/libnone%d.so", t.TempDir(), i)
			_, err := Open(Spec{Lib: "libnone", Extra: []string{path}})
			var le *LibraryError
			if !errors.As(err, &le) {
				errs <- fmt.Errorf("open %s: %v, want a *LibraryError", path, err)
				return
			}
			if !strings.Contains(le.Reason, path) {
				errs <- fmt.Errorf("open %s: reason %q does not name it", path, le.Reason)
				return
			}
			errs <- nil
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
