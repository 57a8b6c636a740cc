package ipc_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
	"github.com/collgen/collgen/runtime/ipc"
	"github.com/collgen/collgen/runtime/rendezvous"
)

const (
	envChild   = "COLLGEN_IPC_TEST_CHILD" // set in the re-executed child: "<rank>:<ordinal>"
	envDir     = "COLLGEN_IPC_TEST_DIR"   // FileStore directory shared with the child
	elems      = 1 << 18
	bufOffset  = 256 // buffers start inside their allocation, to test base+offset
	testKey    = "ipctest"
	ctxTimeout = 60 * time.Second
)

// rankBody runs one rank: fill a buffer with rank+1, exchange, read every
// peer's buffer through the mapping, close, and free after a barrier.
func rankBody(store rendezvous.Store, rank, world, ordinal int) error {
	ctx, cancel := context.WithTimeout(context.Background(), ctxTimeout)
	defer cancel()
	d, err := cuda.Open(ordinal)
	if err != nil {
		return err
	}
	defer d.Close()
	alloc, err := d.Alloc(4*elems + bufOffset)
	if err != nil {
		return err
	}
	defer d.Free(alloc)
	buf := alloc + bufOffset
	if err := d.MemsetD32(buf, math.Float32bits(float32(rank+1)), elems); err != nil {
		return err
	}
	m, err := ipc.Exchange(ctx, store, testKey, rank, world, d, buf, 4*elems)
	if err != nil {
		return err
	}
	scratch, err := d.Alloc(4 * elems)
	if err != nil {
		return err
	}
	defer d.Free(scratch)
	host := make([]byte, 4*elems)
	for r, p := range m.Peers() {
		if err := d.CopyDtoD(scratch, p, 4*elems); err != nil {
			return fmt.Errorf("read rank %d: %w", r, err)
		}
		if err := d.CopyDtoH(host, scratch); err != nil {
			return err
		}
		for _, i := range []int{0, elems / 2, elems - 1} {
			if v := math.Float32frombits(binary.LittleEndian.Uint32(host[4*i:])); v != float32(r+1) {
				return fmt.Errorf("rank %d read rank %d's [%d] = %v, want %d", rank, r, i, v, r+1)
			}
		}
	}
	if err := m.Close(); err != nil {
		return err
	}
	// Nobody frees before every peer has closed its mapping.
	return cudatest.Barrier(ctx, store, testKey+"/closed", world)
}

// TestIPCInProcess: goroutine per GPU; peers use pointers directly.
func TestIPCInProcess(t *testing.T) {
	cudatest.Devices(t, 2)
	store := rendezvous.NewMemStore()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = rankBody(store, r, 2, cudatest.Ordinal(r)) }()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestIPCTwoProcesses: this process is rank 0 on GPU 0 and re-executes the
// test binary as rank 1 on GPU 1 (GPU 0 again when there is one GPU);
// handles go through a FileStore in a temp dir.
func TestIPCTwoProcesses(t *testing.T) {
	if spec := os.Getenv(envChild); spec != "" {
		rank, _ := strconv.Atoi(strings.Split(spec, ":")[0])
		ord, _ := strconv.Atoi(strings.Split(spec, ":")[1])
		store, err := rendezvous.NewFileStore(os.Getenv(envDir))
		if err != nil {
			t.Fatal(err)
		}
		if err := rankBody(store, rank, 2, ord); err != nil {
			t.Fatalf("child rank %d: %v", rank, err)
		}
		return
	}
	cudatest.Devices(t, 1)
	n, _ := cuda.DeviceCount()
	peerOrd := 1
	if n < 2 {
		peerOrd = 0
	}
	dir := t.TempDir()
	store, err := rendezvous.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIPCTwoProcesses$", "-test.v")
	cmd.Env = append(os.Environ(), envChild+"=1:"+strconv.Itoa(peerOrd), envDir+"="+dir)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	perr := rankBody(store, 0, 2, 0)
	cerr := cmd.Wait()
	t.Logf("child (rank 1, device %d) output:\n%s", peerOrd, out.String())
	if perr != nil {
		t.Errorf("parent rank 0: %v", perr)
	}
	if cerr != nil {
		t.Errorf("child rank 1: %v", cerr)
	}
}

// TestIPCUnreachablePeer: a peer "in another process" whose handle cannot
// be collected or opened gives an error naming both ranks, never a crash:
// a record naming no socket, a handout serving a handle of the wrong size,
// and one serving 64 bytes of garbage (reliability case 22).
func TestIPCUnreachablePeer(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	garbage := make([]byte, cuda.IPCHandleSize)
	for i := range garbage {
		garbage[i] = byte(0xA5 ^ i)
	}
	for _, c := range []struct {
		name   string
		handle []byte // nil: the record names no socket
		want   string
	}{
		{"no socket", nil, "names no socket"},
		{"short handle", []byte("short"), "want a 64-byte handle"},
		{"garbage handle", garbage, "open IPC handle"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rec := map[string]any{"rank": 1, "pid": 1, "nonce": "someone-else", "ordinal": 0,
				"bus": "", "base": 4096, "offset": 0, "ptr": 4096, "bytes": 1024}
			if c.handle != nil {
				sock, inst, closeFn, err := ipc.ServeHandleForTest(1, 2, c.handle)
				if err != nil {
					t.Fatal(err)
				}
				defer closeFn()
				rec["sock"], rec["instance"] = sock, inst
			}
			fake, _ := json.Marshal(rec)
			store := rendezvous.NewMemStore()
			store.Set(ctx, testKey+"/ipc/rank1", fake)
			p, err := d.Alloc(1024)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Free(p)
			_, err = ipc.Exchange(ctx, store, testKey, 0, 2, d, p, 1024)
			if err == nil || !strings.Contains(err.Error(), "rank 0 (device 0") || !strings.Contains(err.Error(), "rank 1 (device 0") ||
				!strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming rank 0 and rank 1 and containing %q", err, c.want)
			}
			t.Logf("%v", err)
		})
	}
}

// TestIPCRecordHasNoHandle: what a rank publishes in the store holds no IPC
// handle, only where ranks of its user collect it (reliability case 22).
func TestIPCRecordHasNoHandle(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store := rendezvous.NewMemStore()
	p, err := d.Alloc(1024)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	m, err := ipc.Exchange(ctx, store, testKey, 0, 1, d, p, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rec, err := store.Get(ctx, testKey+"/ipc/rank0")
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(rec, &fields); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := "base bus bytes instance nonce offset ordinal pid ptr rank sock"; strings.Join(keys, " ") != want {
		t.Errorf("the record's fields: %v; want exactly %s (no handle)", keys, want)
	}
	if s, _ := fields["sock"].(string); !strings.HasPrefix(s, "@collgen-ipc-") {
		t.Errorf("the record names socket %v; want @collgen-ipc-...", fields["sock"])
	}
}
