//go:build cgo

package dl

import (
	"errors"
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
