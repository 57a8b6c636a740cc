//go:build unix

package rendezvous

import (
	"os"
	"syscall"
)

// tryFlock takes an exclusive advisory lock on f if no one holds it,
// without waiting, retrying on EINTR; ok is false when another holds it.
func tryFlock(f *os.File) (ok bool, err error) {
	for {
		switch err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err {
		case nil:
			return true, nil
		case syscall.EWOULDBLOCK:
			return false, nil
		case syscall.EINTR:
		default:
			return false, err
		}
	}
}

func funlock(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
