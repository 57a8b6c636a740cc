//go:build cgo

// Package dl opens the shared libraries the runtime reaches at run time
// (libcuda, libnvrtc, libnccl) with dlopen, after go-nvml's pkg/dl: one
// candidate search (an environment override, the dynamic linker's sonames,
// then toolkit directories), reference-counted handles, symbols looked up
// before use (a missing required symbol fails the load, a missing optional
// one only the call that needs it), and one error type naming the library,
// what was tried and what to do.
package dl

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE // dladdr
#include <dlfcn.h>
#include <stdlib.h>

// dlerror's state is per thread, and a goroutine may move to another
// thread between two cgo calls: each call reads it in the same C call
// that failed (*err is NULL on success, or when dlerror has no text).
static void *dl_open(const char *path, int global, const char **err) {
	void *h = dlopen(path, RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
	*err = h ? NULL : dlerror();
	return h;
}
static void *dl_sym(void *h, const char *name) { return dlsym(h, name); }
// dl_file is the file of the object that defines sym (dladdr's
// dli_fname), or NULL.
static const char *dl_file(void *h, const char *sym) {
	Dl_info info;
	void *p = dlsym(h, sym);
	if (p == NULL || dladdr(p, &info) == 0) return NULL;
	return info.dli_fname;
}
static int dl_close(void *h, const char **err) {
	int r = dlclose(h);
	*err = r ? dlerror() : NULL;
	return r;
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"
)

// Spec says how to find one library.
type Spec struct {
	// Lib names the library in errors: "libcuda", "libnvrtc", "libnccl".
	Lib string
	// Env is the override variable: a file, or a directory holding one of
	// Sonames. When it is set only that location is tried, so a bad
	// override is an error, never a silent fallback to another library.
	Env string
	// Sonames are tried in order through the dynamic linker's search.
	Sonames []string
	// Dirs are searched after the linker, for Sonames files that exist.
	Dirs []string
	// Extra are more candidates, tried last (found by the caller, such as
	// versioned names a glob turned up).
	Extra []string
	// Hint tells a user what to do when the library cannot be loaded,
	// e.g. "install the NVIDIA driver or set COLLGEN_CUDA_PATH".
	Hint string
	// Global opens with RTLD_GLOBAL, so libraries opened later resolve
	// symbols against this one.
	Global bool
}

// Candidates lists what Open tries, in order.
func (s Spec) Candidates() []string {
	if v := os.Getenv(s.Env); s.Env != "" && v != "" {
		if st, err := os.Stat(v); err == nil && st.IsDir() {
			out := make([]string, len(s.Sonames))
			for i, n := range s.Sonames {
				out[i] = filepath.Join(v, n)
			}
			return out
		}
		return []string{v}
	}
	out := append([]string(nil), s.Sonames...)
	for _, d := range s.Dirs {
		for _, n := range s.Sonames {
			if p := filepath.Join(d, n); exists(p) {
				out = append(out, p)
			}
		}
	}
	return append(out, s.Extra...)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// LibraryError reports a shared library that could not be loaded or lacks
// a required symbol.
type LibraryError struct {
	Lib    string   // "libcuda", "libnvrtc" or "libnccl"
	Tried  []string // paths or sonames tried, in order
	Symbol string   // the missing symbol, if the library opened
	Reason string   // dlerror text or other detail
	Hint   string   // what to do, if known
}

// Error names the library, what was tried, why it failed and what to do.
func (e *LibraryError) Error() string {
	var s string
	if e.Symbol != "" {
		s = fmt.Sprintf("%s (%s) lacks symbol %s: %s", e.Lib, strings.Join(e.Tried, ", "), e.Symbol, e.Reason)
	} else {
		s = fmt.Sprintf("cannot load %s (tried %s): %s", e.Lib, strings.Join(e.Tried, ", "), e.Reason)
	}
	if e.Hint != "" {
		s += "; " + e.Hint
	}
	return s
}

// Library is an open shared library. Opening the same path twice returns
// the same Library with one more reference; Close drops one, and the last
// dlcloses it.
type Library struct {
	Lib  string // the Spec's Lib
	Path string // the candidate that opened
	hint string // the Spec's Hint, for Missing
	h    unsafe.Pointer
	refs int // guarded by mu
}

var (
	mu   sync.Mutex
	open = map[string]*Library{} // by Path
)

// Open opens the first candidate of s that loads. The error is a
// *LibraryError naming every candidate and the last dlerror.
func Open(s Spec) (*Library, error) {
	cands := s.Candidates()
	mu.Lock()
	defer mu.Unlock()
	var reasons []string
	for _, c := range cands {
		if l := open[c]; l != nil {
			l.refs++
			return l, nil
		}
		cs := C.CString(c)
		global := C.int(0)
		if s.Global {
			global = 1
		}
		var msg *C.char
		h := C.dl_open(cs, global, &msg)
		C.free(unsafe.Pointer(cs))
		if h != nil {
			l := &Library{Lib: s.Lib, Path: c, hint: s.Hint, h: h, refs: 1}
			open[c] = l
			return l, nil
		}
		if msg != nil {
			reasons = append(reasons, C.GoString(msg))
		}
	}
	reason := "not found"
	if len(reasons) > 0 {
		reason = reasons[len(reasons)-1]
	}
	return nil, &LibraryError{Lib: s.Lib, Tried: cands, Reason: reason, Hint: s.Hint}
}

// Handle is the dlopen handle, for a shim that resolves its own table.
// It stays valid until the last Close.
func (l *Library) Handle() unsafe.Pointer { return l.h }

// Sym returns the address of a symbol, or nil when the library lacks it
// (an optional symbol: the caller falls back or fails the one call).
func (l *Library) Sym(name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return C.dl_sym(l.h, cs)
}

// File returns the file the library was loaded from, as the dynamic
// linker found it: a path even when Path is a bare soname the linker
// searched for ("libnvrtc.so.13"). symbol must be one the library itself
// defines (it is looked up, then dladdr names its object); "" when it is
// not found.
func (l *Library) File(symbol string) string {
	cs := C.CString(symbol)
	defer C.free(unsafe.Pointer(cs))
	if f := C.dl_file(l.h, cs); f != nil {
		return C.GoString(f)
	}
	return ""
}

// Missing returns a *LibraryError for a required symbol the library
// lacks; reason says what the library then is not (e.g. "not a usable
// CUDA driver library"). It carries the Spec's Hint (what to install or
// set), as a library that does not load does.
func (l *Library) Missing(symbol, reason string) error {
	return &LibraryError{Lib: l.Lib, Tried: []string{l.Path}, Symbol: symbol, Reason: reason, Hint: l.hint}
}

// Close drops one reference; the last one dlcloses the library. Function
// pointers into it must not be used after that.
func (l *Library) Close() error {
	mu.Lock()
	defer mu.Unlock()
	if l.refs <= 0 {
		return fmt.Errorf("dl: %s (%s) closed more often than opened", l.Lib, l.Path)
	}
	if l.refs--; l.refs > 0 {
		return nil
	}
	delete(open, l.Path)
	var msg *C.char
	if C.dl_close(l.h, &msg) != 0 {
		return fmt.Errorf("dl: dlclose %s: %s", l.Path, C.GoString(msg))
	}
	return nil
}
