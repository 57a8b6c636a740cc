package gen

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// NoModuleError is ImportPath's error for a directory in no Go module:
// the generated package imports <out>/cuda by its module path, so a tree
// written there could not build.
type NoModuleError struct {
	// Dir is the output directory as given.
	Dir string
}

// Error names the directory and the two ways out.
func (e *NoModuleError) Error() string {
	return fmt.Sprintf("%s is in no Go module (no go.mod in it or any directory above it), and the generated package imports %s/cuda by its module path: run go mod init in your project first, or give --out a directory inside a module", e.Dir, e.Dir)
}

// ImportPath returns the Go import path of directory dir (which need not
// exist yet): the module path of the nearest go.mod above it joined with
// dir's path inside that module, or a *NoModuleError outside any module.
func ImportPath(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for root := abs; ; root = filepath.Dir(root) {
		b, err := os.ReadFile(filepath.Join(root, "go.mod"))
		switch {
		case err == nil:
			mod := modulePath(b)
			if mod == "" {
				return "", errors.New(filepath.Join(root, "go.mod") + " has no module line")
			}
			rel, err := filepath.Rel(root, abs)
			if err != nil {
				return "", err
			}
			imp := path.Join(mod, filepath.ToSlash(rel))
			if err := checkImportPath(imp); err != nil {
				return "", fmt.Errorf("output directory %s: %w", dir, err)
			}
			return imp, nil
		case !errors.Is(err, fs.ErrNotExist):
			return "", err
		}
		if filepath.Dir(root) == root {
			return "", &NoModuleError{Dir: dir}
		}
	}
}

// modulePath returns the path of go.mod's module directive, or "".
func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line, _, _ = strings.Cut(line, "//"); !strings.HasPrefix(line, "module") {
			continue
		}
		mod := strings.TrimSpace(strings.TrimPrefix(line, "module"))
		if uq, err := strconv.Unquote(mod); err == nil {
			mod = uq
		}
		return mod
	}
	return ""
}

// checkImportPath refuses an import path the go command would: an element
// that is empty, "." or "..", starts with a dot, or holds anything but
// ASCII letters, digits and "-._~" (a space, a non-ASCII letter).
func checkImportPath(imp string) error {
	for _, el := range strings.Split(imp, "/") {
		bad := el == "" || el[0] == '.' || strings.IndexFunc(el, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~", r))
		}) >= 0
		if bad {
			return fmt.Errorf("its import path %q has the element %q, which Go refuses (ASCII letters, digits and -._~, not starting with a dot); choose another directory name", imp, el)
		}
	}
	return nil
}
