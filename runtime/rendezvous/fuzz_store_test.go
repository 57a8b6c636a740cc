package rendezvous_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// fuzzKeys are the keys FuzzStoreModel uses: plain, empty, path-like,
// traversal-like, unicode, NUL, long (the file store hashes names past a
// length) and one the collectives use.
var fuzzKeys = []string{"a", "", "x/y", "../../etc/passwd", "é/ü", "nul\x00key", strings.Repeat("k", 300), "collgen/barrier/0"}

// FuzzStoreModel runs any sequence of Set, Get, Add, CompareAndSet and
// Delete on the in-memory, file and TCP stores against a map: every
// result equals the model's (a Get of an absent key times out with
// ErrTimeout; Add on a non-decimal value fails and changes nothing), for
// any key and value bytes.
func FuzzStoreModel(f *testing.F) {
	f.Add([]byte{0, 0, 3, 1, 0, 2, 0, 2, 4, 5, 1, 3, 2, 1, 0, 3, 0, 4})
	f.Add([]byte{2, 6, 7, 2, 6, 250, 0, 6, 1, 1, 6, 0, 4, 6, 0})
	dir := f.TempDir()
	srv, err := rendezvous.NewTCPServer("127.0.0.1:0", rendezvous.ServerOptions{Secret: []byte{}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { srv.Close() })
	run := 0
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 120 {
			ops = ops[:120]
		}
		run++
		mem := rendezvous.NewMemStore()
		defer mem.Close()
		file, err := rendezvous.NewFileStore(dir + "/" + strconv.Itoa(run))
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		tcp, err := rendezvous.DialTCP(context.Background(), srv.Addr(), rendezvous.ClientOptions{Secret: []byte{}})
		if err != nil {
			t.Fatal(err)
		}
		defer tcp.Close()
		prefix := "run" + strconv.Itoa(run) + "/" // the TCP server is shared across runs
		stores := map[string]rendezvous.Store{"mem": mem, "file": file, "tcp": tcp}
		model := map[string][]byte{}
		arg := func(i int) int {
			if i < len(ops) {
				return int(ops[i])
			}
			return 0
		}
		value := func(i int) []byte { // empty, decimal, or arbitrary bytes
			switch arg(i) % 4 {
			case 0:
				return []byte{}
			case 1:
				return []byte(strconv.Itoa(arg(i) - 128))
			default:
				return bytes.Repeat([]byte{byte(arg(i))}, arg(i)%9)
			}
		}
		for i := 0; i < len(ops); i += 3 {
			key := fuzzKeys[arg(i+1)%len(fuzzKeys)]
			old, present := model[key]
			for name, s := range stores {
				k := key
				if name == "tcp" {
					k = prefix + key
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				switch ops[i] % 5 {
				case 0: // Set
					if err := s.Set(ctx, k, value(i+2)); err != nil {
						t.Fatalf("%s Set(%q): %v", name, key, err)
					}
				case 1: // Get
					short, stop := context.WithTimeout(ctx, 20*time.Millisecond)
					got, err := s.Get(short, k)
					stop()
					switch {
					case present && (err != nil || !bytes.Equal(got, old) || got == nil):
						t.Fatalf("%s Get(%q) = %q, %v; want %q", name, key, got, err, old)
					case !present && !errors.Is(err, rendezvous.ErrTimeout):
						t.Fatalf("%s Get(%q) of an absent key: %q, %v; want ErrTimeout", name, key, got, err)
					}
				case 2: // Add
					delta := int64(arg(i+2)) - 100
					n, err := s.Add(ctx, k, delta)
					cur, perr := int64(0), error(nil)
					if present {
						cur, perr = strconv.ParseInt(string(old), 10, 64)
					}
					switch {
					case perr != nil && err == nil:
						t.Fatalf("%s Add(%q) on %q: %d, want an error", name, key, old, n)
					case perr == nil && (err != nil || n != cur+delta):
						t.Fatalf("%s Add(%q, %d) on %q: %d, %v; want %d", name, key, delta, old, n, err, cur+delta)
					}
				case 3: // CompareAndSet with the model's value or another
					want := old
					if !present {
						want = nil
					}
					if arg(i+2)%3 == 0 {
						want = []byte("other")
					}
					cur, swapped, err := s.CompareAndSet(ctx, k, want, value(i+2))
					match := (want == nil && !present) || (want != nil && present && bytes.Equal(want, old))
					if err != nil || swapped != match {
						t.Fatalf("%s CompareAndSet(%q, %q): swapped %v, %v; want swapped %v (value %q, present %v)", name, key, want, swapped, err, match, old, present)
					}
					if match && !bytes.Equal(cur, value(i+2)) || !match && present && !bytes.Equal(cur, old) || !match && !present && cur != nil {
						t.Fatalf("%s CompareAndSet(%q): current %q", name, key, cur)
					}
				case 4: // Delete
					existed, err := s.Delete(ctx, k)
					if err != nil || existed != present {
						t.Fatalf("%s Delete(%q): %v, %v; want %v", name, key, existed, err, present)
					}
				}
				cancel()
			}
			// The model.
			switch ops[i] % 5 {
			case 0:
				model[key] = value(i + 2)
			case 2:
				cur, perr := int64(0), error(nil)
				if present {
					cur, perr = strconv.ParseInt(string(old), 10, 64)
				}
				if perr == nil {
					model[key] = []byte(strconv.FormatInt(cur+int64(arg(i+2))-100, 10))
				}
			case 3:
				want := old
				if !present {
					want = nil
				}
				if arg(i+2)%3 == 0 {
					want = []byte("other")
				}
				if (want == nil && !present) || (want != nil && present && bytes.Equal(want, old)) {
					model[key] = value(i + 2)
				}
			case 4:
				delete(model, key)
			}
		}
		// Clean the shared server's keys.
		for _, key := range fuzzKeys {
			tcp.Delete(context.Background(), prefix+key)
		}
	})
}
