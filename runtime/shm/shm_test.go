package shm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func testName(t *testing.T) string {
	return fmt.Sprintf("%stest-%d-%s", Prefix, os.Getpid(), filepath.Base(t.Name()))
}

func providers(t *testing.T) map[string]Provider {
	return map[string]Provider{"posix": Posix{}, "inprocess": InProcess{}}
}

func TestLifecycle(t *testing.T) {
	for kind, p := range providers(t) {
		t.Run(kind, func(t *testing.T) {
			name := testName(t)
			s, err := p.Create(name, 8192)
			if err != nil {
				t.Fatal(err)
			}
			s.Bytes()[100] = 42
			if _, err := p.Create(name, 8192); !errors.Is(err, ErrExists) {
				t.Fatalf("second create: %v, want ErrExists", err)
			}
			if _, err := p.Open(name, 4096); err == nil {
				t.Fatal("open with the wrong size succeeded")
			}
			o, err := p.Open(name, 8192)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Unlink(name); err != nil {
				t.Fatal(err)
			}
			if got := o.Bytes()[100]; got != 42 {
				t.Fatalf("peer view reads %d, want 42", got)
			}
			s.Bytes()[101] = 7 // still shared after unlink
			if got := o.Bytes()[101]; got != 7 {
				t.Fatalf("peer view after unlink reads %d, want 7", got)
			}
			if err := p.Unlink(name); !errors.Is(err, ErrNotFound) {
				t.Fatalf("second unlink: %v", err)
			}
			if _, err := p.Open(name, 8192); !errors.Is(err, ErrNotFound) {
				t.Fatalf("open after unlink: %v", err)
			}
			s.Close()
			o.Close()
		})
	}
}

func TestPosixRefusesSquatters(t *testing.T) {
	p := Posix{}
	name := testName(t)
	path := p.Path(name)
	// Someone pre-creates the name, world readable.
	if err := os.WriteFile(path, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	if _, err := p.Create(name, 4096); !errors.Is(err, ErrExists) {
		t.Fatalf("create over a squatted name: %v", err)
	}
	os.Chmod(path, 0o644)
	if _, err := p.Open(name, 4096); err == nil {
		t.Fatal("opened a 0644 segment")
	}
	os.Remove(path)
	if err := os.Symlink("/etc/passwd", path); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Open(name, 4096); err == nil {
		t.Fatal("followed a symlink")
	}
	if _, err := p.Create(name, 4096); !errors.Is(err, ErrExists) {
		t.Fatalf("create over a symlink: %v", err)
	}
}

// TestPosixRefusesOtherUser: a file of another user under a segment name,
// empty or of the right size and mode 0600 (what a dead rank of ours would
// leave), is refused by Create and Open and never removed by RemoveStale
// or SweepRun. Setting it up takes root (chown); elsewhere the test skips,
// and the code's check is the fstat in Open and removeStale.
func TestPosixRefusesOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a file owned by another user")
	}
	const other, runID = 65534, "otheruser01"
	for _, size := range []int{0, 4096} {
		name := fmt.Sprintf("%stest-%d-%s.%d", Prefix, os.Getpid(), runID, size)
		path := Posix{}.Path(name)
		if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(path)
		if err := os.Chown(path, other, other); err != nil {
			t.Fatal(err)
		}
		if _, err := (Posix{}).Create(name, 4096); !errors.Is(err, ErrExists) {
			t.Errorf("size %d: create over another user's file: %v, want ErrExists", size, err)
		}
		if _, err := (Posix{}).Open(name, 4096); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("owned by uid %d", other)) {
			t.Errorf("size %d: open: %v, want a refusal naming uid %d", size, err, other)
		}
		if removed, err := RemoveStale(Posix{}, name, 4096, func([]byte) bool { return true }); removed || err != nil {
			t.Errorf("size %d: RemoveStale: %v, %v; want it left alone", size, removed, err)
		}
		if removed, err := SweepRun("", runID); len(removed) > 0 || err != nil {
			t.Errorf("size %d: SweepRun removed %v (%v)", size, removed, err)
		}
		if st, err := os.Stat(path); err != nil || st.Size() != int64(size) {
			t.Errorf("size %d: the other user's file is gone or changed: %v", size, err)
		}
	}
}

func TestPosixModeAndNoSpace(t *testing.T) {
	p := Posix{}
	name := testName(t)
	s, err := p.Create(name, 4096)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode())
	}
	p.Unlink(name)
	s.Close()
	// Far more than any tmpfs holds: must fail at create, leaving nothing.
	if _, err := p.Create(name, 1<<46); err == nil {
		t.Fatal("created a 64 TiB segment")
	} else if !errors.Is(err, ErrNoSpace) {
		t.Errorf("64 TiB segment: %v; want ErrNoSpace", err)
	}
	if _, err := os.Stat(p.Path(name)); !os.IsNotExist(err) {
		t.Fatalf("failed create left %s behind: %v", name, err)
	}
}

func TestCheckName(t *testing.T) {
	for _, bad := range []string{"x", "collgen-../x", "collgen-a/b", ""} {
		if CheckName(bad) == nil {
			t.Errorf("CheckName(%q) accepted", bad)
		}
	}
	if err := CheckName("collgen-0123abcd-ff-r3"); err != nil {
		t.Error(err)
	}
}

// TestRemoveStale: what a rank killed during set-up leaves (an empty file,
// or a whole segment with a valid header) is removed whatever its size,
// while files that are not provably ours stay.
func TestRemoveStale(t *testing.T) {
	p := Posix{}
	valid := func(m []byte) bool { return m[0] == 'c' }
	for _, tc := range []struct {
		name    string
		content []byte
		mode    os.FileMode
		removed bool
	}{
		{"empty", nil, 0o600, true}, // killed between open(O_CREAT) and fallocate
		{"whole", append([]byte{'c'}, make([]byte, 4095)...), 0o600, true},
		{"whole-invalid", make([]byte, 4096), 0o600, false}, // valid says not ours
		{"other-size", []byte("not yours"), 0o600, false},
		{"empty-0644", nil, 0o644, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := testName(t)
			path := p.Path(name)
			if err := os.WriteFile(path, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(path)
			os.Chmod(path, tc.mode)
			removed, err := RemoveStale(p, name, 4096, valid)
			if err != nil {
				t.Fatal(err)
			}
			_, statErr := os.Stat(path)
			if removed != tc.removed || os.IsNotExist(statErr) != tc.removed {
				t.Fatalf("removed = %v, file gone = %v; want %v", removed, os.IsNotExist(statErr), tc.removed)
			}
		})
	}
	if removed, err := RemoveStale(p, testName(t)+"-missing", 4096, valid); removed || err != nil {
		t.Fatalf("missing name: %v %v", removed, err)
	}
}

// TestSweepRun removes every name of one run that we own, whatever its
// size, and nothing of other runs or other owners' modes.
func TestSweepRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, size int, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(dir, name), mode)
	}
	write("collgen-0011223344556677-run12345.aa-r0", 0, 0o600)
	write("collgen-0011223344556677-run12345.aa-r1", 8192, 0o600)
	write("collgen-0011223344556677-run99999.aa-r0", 0, 0o600) // another run
	write("collgen-0011223344556677-run12345.aa-r2", 0, 0o644) // not our mode
	write("other-0011223344556677-run12345.aa-r0", 0, 0o600)   // not collgen's
	removed, err := SweepRun(dir, "run12345")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(removed) != "[collgen-0011223344556677-run12345.aa-r0 collgen-0011223344556677-run12345.aa-r1]" {
		t.Fatalf("removed %v", removed)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 3 {
		t.Fatalf("left %v, want 3 names", left)
	}
	if _, err := SweepRun(dir, "x"); err == nil {
		t.Fatal("accepted a bad run id")
	}
}

// TestInProcessBeyondMemory: an in-process segment larger than the
// process can hold is refused with ErrNoSpace, naming the size, and
// nothing is registered. (Before, Create panicked in make: "len out of
// range" for the largest sizes, a fatal out-of-memory below them.)
func TestInProcessBeyondMemory(t *testing.T) {
	p := InProcess{}
	name := testName(t)
	for _, size := range []int{math.MaxInt, 1 << 62, 1 << 46} {
		s, err := p.Create(name, size)
		if err == nil {
			s.Close()
			p.Unlink(name)
			t.Fatalf("created an in-process segment of %d bytes", size)
		}
		if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), fmt.Sprint(size)) {
			t.Errorf("Create(%d): %v; want ErrNoSpace naming the size", size, err)
		}
	}
	if slices.Contains(InProcessNames(), name) {
		t.Errorf("a refused Create left %s registered", name)
	}
}

// TestArgumentErrors: every refusal of an argument wraps ErrInvalidArgument
// and names the value (they were untyped errors), on both providers, and
// creates nothing: /dev/shm and the in-process registry hold no name of
// this test's afterwards. Posix.Open of size 0 on an empty file reached
// mmap ("invalid argument" from the kernel), and InProcess.Open and Unlink
// took any name, where Posix refuses it.
func TestArgumentErrors(t *testing.T) {
	name := testName(t)
	type bad struct {
		what string
		err  error
		want string
	}
	var cases []bad
	for kind, p := range providers(t) {
		create := func(name string, size int) error {
			s, err := p.Create(name, size)
			if err == nil {
				s.Close()
				p.Unlink(name)
			}
			return err
		}
		open := func(name string, size int) error {
			s, err := p.Open(name, size)
			if err == nil {
				s.Close()
			}
			return err
		}
		cases = append(cases,
			bad{kind + " create size 0", create(name, 0), "size 0 must be positive"},
			bad{kind + " create size -1", create(name, -1), "size -1 must be positive"},
			bad{kind + " create most negative size", create(name, math.MinInt), fmt.Sprintf("size %d", math.MinInt)},
			bad{kind + " create bad name", create("x", 4096), `bad segment name "x"`},
			bad{kind + " create name with a slash", create(Prefix+"a/b", 4096), "only letters"},
			bad{kind + " open size 0", open(name, 0), "size 0 must be positive"},
			bad{kind + " open size -4096", open(name, -4096), "size -4096 must be positive"},
			bad{kind + " open bad name", open("../etc/passwd", 4096), `bad segment name "../etc/passwd"`},
			bad{kind + " unlink bad name", p.Unlink("y"), `bad segment name "y"`},
			bad{kind + " remove stale size -1", func() error { _, err := RemoveStale(p, name, -1, nil); return err }(), "size -1"},
			bad{kind + " remove stale bad name", func() error { _, err := RemoveStale(p, "z", 4096, nil); return err }(), `bad segment name "z"`},
		)
	}
	cases = append(cases,
		bad{"remove stale nil provider", func() error { _, err := RemoveStale(nil, name, 4096, nil); return err }(), "nil Provider"},
		bad{"sweep short run id", func() error { _, err := SweepRun(t.TempDir(), "x"); return err }(), `run id "x"`},
		bad{"sweep run id with a dot", func() error { _, err := SweepRun(t.TempDir(), "abcd.efgh"); return err }(), `run id "abcd.efgh"`},
		bad{"claim bad run id", func() error { _, err := ClaimRun(t.TempDir(), "../../x"); return err }(), `run id "../../x"`},
		bad{"check run id", CheckRunID(strings.Repeat("a", 17)), "want 8 to 16"},
		bad{"check name", CheckName(Prefix + strings.Repeat("n", 200)), "at most 200 bytes"},
	)
	for _, c := range cases {
		if !errors.Is(c.err, ErrInvalidArgument) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: %v; want ErrInvalidArgument saying %q", c.what, c.err, c.want)
		}
	}
	// A size-0 open of an existing empty segment file is refused before
	// the file is opened, not by mmap.
	path := Posix{}.Path(name)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Posix{}.Open(name, 0)
	os.Remove(path)
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("open of an empty segment with size 0: %v; want ErrInvalidArgument", err)
	}
	if left, err := Leftovers("", ""); err != nil || len(left) != 0 {
		t.Errorf("left in /dev/shm: %v %v", left, err)
	}
	if left := InProcessNames(); len(left) != 0 {
		t.Errorf("left in-process: %v", left)
	}
}
