package cli

import (
	"os"
	"path/filepath"
)

// writeFileAtomic writes data to path through a temporary file in the same
// directory and a rename, so a failed write (a full disk, a quota) leaves
// path as it was (tune --out may name the very spec it read), and a reader
// polling for path (a results file, a store's address file) never sees
// half of it. The file gets
// path's own mode when it exists, perm otherwise. The temporary file is
// removed on any failure.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	return writeFileVia(path, data, perm, true)
}

// writeFileNew is writeFileAtomic for a file that must not exist: the
// complete temporary file is hard-linked to path, which fails with an
// error matching fs.ErrExist if path exists by then (a check before the
// write cannot see a file another process creates after it).
func writeFileNew(path string, data []byte, perm os.FileMode) error {
	return writeFileVia(path, data, perm, false)
}

// writeFileVia writes through a temporary file, then renames it over path
// (replace) or links it to path and removes it (not replace).
func writeFileVia(path string, data []byte, perm os.FileMode, replace bool) (err error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
		perm = fi.Mode().Perm()
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if replace {
		return os.Rename(f.Name(), path)
	}
	if err = os.Link(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return os.Remove(f.Name())
}
