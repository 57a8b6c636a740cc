//go:build !unix

package rendezvous

import (
	"errors"
	"os"
)

// tryFlock is unsupported off unix; the file store refuses writes there.
func tryFlock(f *os.File) (bool, error) {
	return false, errors.New("file locking is not supported on this platform; use the tcp store")
}

func funlock(f *os.File) error { return nil }
