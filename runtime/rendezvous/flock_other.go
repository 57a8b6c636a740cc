//go:build !unix

package rendezvous

import (
	"errors"
	"os"
)

// flock is unsupported off unix; the file store refuses writes there.
func flock(f *os.File) error {
	return errors.New("file locking is not supported on this platform; use the tcp store")
}

func funlock(f *os.File) error { return nil }
