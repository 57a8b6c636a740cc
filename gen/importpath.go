package gen

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// ImportPath returns the Go import path of directory dir (which need not
// exist yet): the module path of the nearest go.mod above it joined with
// dir's path inside that module. Outside any module it returns dir in slash
// form: the tree still renders, but its Go package builds only in a module.
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
			return path.Join(mod, filepath.ToSlash(rel)), nil
		case !errors.Is(err, fs.ErrNotExist):
			return "", err
		}
		if filepath.Dir(root) == root {
			return filepath.ToSlash(filepath.Clean(dir)), nil
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
