//go:build linux

package fdpass

import (
	"encoding/binary"
	"slices"
	"syscall"
	"testing"
)

// FuzzParseRights feeds any control data to parseRights, as Recv does with
// what the kernel hands it: descriptors (at most one per 4 bytes) and
// maybe an error, never a panic; the descriptors of well-formed SCM_RIGHTS
// messages built from the input come back in order, followed by those of
// any malformed tail that parsed.
func FuzzParseRights(f *testing.F) {
	f.Add([]byte{}, []byte{})
	f.Add(syscall.UnixRights(3, 4, 5), []byte{0, 0, 0, 7})
	f.Add(append(syscall.UnixRights(9), syscall.UnixRights(10, 11)...), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add(syscall.UnixRights(3)[:12], []byte{})
	cred := syscall.UnixCredentials(&syscall.Ucred{Pid: 1, Uid: 2, Gid: 3})
	f.Add(append(cred, syscall.UnixRights(6)...), []byte{0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, oob, fdBytes []byte) {
		fds, err := parseRights(oob)
		if len(fds) > len(oob)/4 {
			t.Fatalf("%d descriptors from %d bytes (error %v)", len(fds), len(oob), err)
		}
		if len(oob) == 0 && (fds != nil || err != nil) {
			t.Fatalf("empty control data: %v, %v", fds, err)
		}

		// Well-formed: the input's 4-byte groups as descriptors, at most
		// MaxFiles a message, then the arbitrary data as a tail.
		var want []int
		for len(fdBytes) >= 4 && len(want) < 64 {
			want = append(want, int(int32(binary.LittleEndian.Uint32(fdBytes))))
			fdBytes = fdBytes[4:]
		}
		var msg []byte
		for rest := want; len(rest) > 0; {
			n := min(len(rest), MaxFiles)
			msg = append(msg, syscall.UnixRights(rest[:n]...)...)
			rest = rest[n:]
		}
		got, err := parseRights(msg)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("UnixRights(%v) parsed as %v, %v", want, got, err)
		}
		got, err = parseRights(append(msg, oob...))
		if len(want) > 0 && (len(got) < len(want) || !slices.Equal(got[:len(want)], want)) && err == nil {
			t.Fatalf("UnixRights(%v) and a tail parsed as %v without error", want, got)
		}
	})
}
