package comm

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/cuda"
)

// TestPreloadAtNew: by default New readies every kernel of the world size
// (each once, in library order) before any call.
func TestPreloadAtNew(t *testing.T) {
	comms, devs := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	var want []string
	for _, k := range collectives.Library.Kernels {
		if k.World == 2 {
			want = append(want, k.Name)
		}
	}
	if len(want) == 0 {
		t.Fatal("the library has no kernels of world size 2")
	}
	for r, d := range devs {
		var got []string
		for _, k := range d.preloaded {
			got = append(got, k.Name)
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("rank %d preloaded %d kernels %v, want the %d of world 2", r, len(got), got, len(want))
		}
	}
}

// TestLazyKernels: with Config.LazyKernels, New readies no kernel, except
// where ranks share a GPU (there a kernel's first load could wait for a
// peer's kernel that waits for this rank).
func TestLazyKernels(t *testing.T) {
	comms, devs := fakeComms(t, 2, Config{LazyKernels: true})
	defer closeAll(t, comms)
	for r, d := range devs {
		if len(d.preloaded) != 0 {
			t.Fatalf("rank %d preloaded %d kernels with LazyKernels", r, len(d.preloaded))
		}
	}
	shared := []*fakeDevice{{rank: 0, bus: "0000:10:00.0"}, {rank: 1, bus: "0000:10:00.0"}}
	sc, errs := newFakeComms(t, Config{LazyKernels: true}, shared)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, sc)
	for r, d := range shared {
		if len(d.preloaded) == 0 {
			t.Errorf("rank %d sharing a GPU preloaded nothing with LazyKernels", r)
		}
	}
	// Only ranks of one process share a context: process ranks on one
	// GPU each have their own, and load lazily.
	det := &Detected{BusIDs: []string{"0000:10:00.0", "0000:10:00.0", "0000:11:00.0"}}
	for _, c := range []struct {
		procs []string
		me    int
		want  bool
	}{
		{[]string{"h/1", "h/1", "h/1"}, 0, true},  // goroutine ranks, rank 1 on the same GPU
		{[]string{"h/1", "h/2", "h/1"}, 0, false}, // the rank on its GPU is another process
		{[]string{"h/1", "h/1", "h/1"}, 2, false}, // alone on its GPU
	} {
		all := make([]gpuAgreement, len(c.procs))
		for r, p := range c.procs {
			all[r].Process = p
		}
		if got := sharesContext(det, c.me, all); got != c.want {
			t.Errorf("sharesContext(rank %d, processes %v) = %v, want %v", c.me, c.procs, got, c.want)
		}
	}
	if sharesContext(nil, 0, []gpuAgreement{{}}) {
		t.Error("sharesContext without a detection (one rank) = true")
	}
}

// TestPreloadErrorFailsNew: a kernel that fails to compile fails New with
// a *KernelError naming it (over NVRTC's *cuda.CompileError, and
// ErrDevice), and the device is released.
func TestPreloadErrorFailsNew(t *testing.T) {
	const name = "allreduce_oneshot_bf16_sum_w2"
	devs := make([]*fakeDevice, 2)
	for r := range devs {
		devs[r] = &fakeDevice{rank: r, preloadErr: &KernelError{Kernel: name,
			Err: &cuda.CompileError{Name: name + ".cu", Arch: 90, Result: "NVRTC_ERROR_COMPILATION", Log: "error: fake"}}}
	}
	comms, errs := newFakeComms(t, Config{}, devs)
	for r, err := range errs {
		var ke *KernelError
		var ce *cuda.CompileError
		if comms[r] != nil || !errors.As(err, &ke) || !errors.As(err, &ce) || !errors.Is(err, ErrDevice) {
			t.Fatalf("rank %d: New = %v, %v; want a *KernelError over a *cuda.CompileError, ErrDevice", r, comms[r], err)
		}
		if ke.Kernel != name || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", r)) {
			t.Fatalf("rank %d: error does not name the kernel and rank: %v", r, err)
		}
		if !devs[r].released {
			t.Fatalf("rank %d: device not released after New failed", r)
		}
	}
}

// TestKernelErrorKind: a KernelError matches exactly one sentinel:
// ErrDevice, or its cause's kind when the cause has one.
func TestKernelErrorKind(t *testing.T) {
	dev := &KernelError{Kernel: "k", Err: &cuda.CompileError{Name: "k.cu"}}
	lib := &KernelError{Kernel: "k", Err: errorf(ErrInvalidArgument, "no source k.cu")}
	for _, tc := range []struct {
		err  error
		kind error
	}{{dev, ErrDevice}, {lib, ErrInvalidArgument}} {
		for _, s := range sentinels {
			if got := errors.Is(tc.err, s); got != (s == tc.kind) {
				t.Errorf("%v: errors.Is(%v) = %v", tc.err, s, got)
			}
		}
	}
}

// TestFatbinErrorKinds: a missing fatbin is ErrInvalidArgument naming the
// file and `collgen fatbin`; a fatbin without code for the device is
// ErrUnsupported keeping the *cuda.FatbinError (what it holds, the
// device's architecture); a driver failure is ErrDevice.
func TestFatbinErrorKinds(t *testing.T) {
	missing := &cuda.FatbinError{Fatbin: "/x/k.fatbin", Arch: 90, Err: fmt.Errorf("open /x/k.fatbin: %w", fs.ErrNotExist)}
	mismatch := &cuda.FatbinError{Fatbin: "/x/k.fatbin", Arch: 100, Codes: []cuda.FatbinCode{{Arch: 90}}, Err: errors.New("CUDA_ERROR_NO_BINARY_FOR_GPU")}
	for _, tc := range []struct {
		err  error
		kind error
		says []string
	}{
		{missing, ErrInvalidArgument, []string{"rank 3", "/x/k.fatbin", "does not exist", "collgen fatbin", EnvFatbin}},
		{mismatch, ErrUnsupported, []string{"rank 3", "holds sm_90", "sm_100"}},
		{errors.New("CUDA_ERROR_INVALID_IMAGE"), ErrDevice, []string{"rank 3", "/x/k.fatbin", "INVALID_IMAGE"}},
	} {
		err := fatbinError(3, "/x/k.fatbin", tc.err)
		if !errors.Is(err, tc.kind) || !errors.Is(err, tc.err) {
			t.Errorf("%v: got %v, want %v wrapping the cause", tc.err, err, tc.kind)
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%q lacks %q", err, s)
			}
		}
	}
	if fatbinError(0, "", nil) != nil {
		t.Error("fatbinError(nil) != nil")
	}
}

// TestSharedGPUWorkQueues (reliability case 34): ranks of one process on
// one GPU are refused, on every rank and before any kernel loads, when
// their CUDA context has fewer than 32 hardware work queues
// (CUDA_DEVICE_MAX_CONNECTIONS), and the devices are released; with 32,
// or with a GPU each, the same queues are fine.
func TestSharedGPUWorkQueues(t *testing.T) {
	for _, c := range []struct {
		name   string
		queues int
		buses  []string
		refuse bool
	}{
		{"shared-8", 8, []string{"0000:10:00.0", "0000:10:00.0"}, true},
		{"shared-1", 1, []string{"0000:10:00.0", "0000:11:00.0", "0000:10:00.0"}, true},
		{"shared-32", 32, []string{"0000:10:00.0", "0000:10:00.0"}, false},
		{"own-gpus-8", 8, []string{"0000:10:00.0", "0000:11:00.0"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			devs := make([]*fakeDevice, len(c.buses))
			for r, b := range c.buses {
				devs[r] = &fakeDevice{rank: r, bus: b, queues: c.queues}
			}
			comms, errs := newFakeComms(t, Config{}, devs)
			if !c.refuse {
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				closeAll(t, comms)
				return
			}
			for r, err := range errs {
				if comms[r] != nil || !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), cuda.EnvMaxConnections+"=32") ||
					!strings.Contains(err.Error(), "share GPU 0000:10:00.0") {
					t.Fatalf("rank %d: New = %v, %v; want ErrUnsupported naming the shared GPU and %s=32", r, comms[r], err, cuda.EnvMaxConnections)
				}
				if len(devs[r].preloaded) != 0 || !devs[r].released {
					t.Fatalf("rank %d: %d kernels preloaded, released %v; want none and released", r, len(devs[r].preloaded), devs[r].released)
				}
			}
		})
	}
}

// TestTimeoutHintSharedContext: a kernel's timeout waiting for a rank of
// this process on the same GPU (one CUDA context) says how such a rank is
// held back (reliability case 39); waiting for a rank on another GPU, it
// does not.
func TestTimeoutHintSharedContext(t *testing.T) {
	diagnoseFor(t, 50*time.Millisecond) // the peers are not waiting
	buses := []string{"0000:10:00.0", "0000:10:00.0", "0000:11:00.0"}
	devs := make([]*fakeDevice, len(buses))
	for r, b := range buses {
		devs[r] = &fakeDevice{rank: r, bus: b, queues: 32}
	}
	comms, errs := newFakeComms(t, Config{}, devs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	for _, c := range []struct {
		rank, peer int
		hint       bool
	}{{0, 1, true}, {1, 2, false}, {2, 0, false}} { // one each: a timeout breaks the communicator
		devs[c.rank].statusVal = uint64(5)<<48 | 1<<32 | 0<<24 | uint64(c.peer)<<16 | uint64(c.rank)<<8 | 1
		err := comms[c.rank].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 64, coll.F32, coll.Sum, Options{})
		var te *TimeoutError
		if !errors.As(err, &te) || te.Peer != c.peer {
			t.Fatalf("rank %d waiting for %d: %v", c.rank, c.peer, err)
		}
		if got := strings.Contains(err.Error(), "shares this GPU's CUDA context"); got != c.hint {
			t.Errorf("rank %d waiting for rank %d: hint %v, want %v: %v", c.rank, c.peer, got, c.hint, err)
		}
	}
}
