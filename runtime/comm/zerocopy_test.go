package comm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/schedule"
)

// TestStageMapping checks, for every kernel of the shipped library, where
// a symmetric input stands in for the stage slot: every barrier kernel
// can read its input in place, reducing collectives stage chunk c at chunk
// c, all-gather stages its one chunk at chunk rank; push kernels stage
// nothing. A schedule that writes the stage with a reduction cannot.
func TestStageMapping(t *testing.T) {
	eligible := map[coll.Collective]int{}
	for i := range collectives.Library.Kernels {
		k := &collectives.Library.Kernels[i]
		s, err := schedule.Build(k.Collective, k.Algorithm, k.World)
		if err != nil {
			t.Fatal(err)
		}
		m, ok := stageMapping(s)
		if k.Protocol.Push() {
			if ok {
				t.Errorf("%s: push kernel has a stage mapping %v", k.Name, m.delta)
			}
			continue
		}
		if !ok {
			t.Errorf("%s: barrier kernel cannot read a symmetric input in place", k.Name)
			continue
		}
		eligible[k.Collective]++
		for r, d := range m.delta {
			want := 0
			if !k.Collective.Reduces() {
				want = r
			}
			if d != want {
				t.Errorf("%s: rank %d stages input chunk c at chunk c%+d, want c%+d", k.Name, r, d, want)
			}
		}
	}
	for _, c := range []coll.Collective{coll.AllReduce, coll.ReduceScatter, coll.AllGather} {
		if eligible[c] == 0 {
			t.Errorf("no %s kernel reads in place", c)
		}
	}
	s, err := schedule.Build(coll.AllReduce, coll.TwoShot, 2)
	if err != nil {
		t.Fatal(err)
	}
	bad := *s
	bad.Phases = append([]schedule.Phase{{Steps: []schedule.Step{{Kind: schedule.Reduce,
		Dst:  schedule.Ref{Buf: schedule.Stage, Rank: schedule.Self, Chunk: schedule.Self},
		Srcs: []schedule.Ref{{Buf: schedule.Input, Rank: schedule.Self, Chunk: schedule.Self}, {Buf: schedule.Input, Rank: schedule.Self, Chunk: schedule.Rel(1)}}}}}}, s.Phases...)
	if m, ok := stageMapping(&bad); ok {
		t.Errorf("a schedule reducing into the stage got mapping %v", m.delta)
	}
}

// TestFakeZeroCopyAllGather checks an all-gather whose input is symmetric:
// one slot, and stage[r] placed so that stage chunk r is rank r's input.
func TestFakeZeroCopyAllGather(t *testing.T) {
	comms, devs := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	syms := allocOnRanks(t, comms, 1<<20)
	const count, off = 1000, 512 // f32 elements per rank; input offset in the buffer
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		return c.AllGather(DeviceBuffer(syms[r]+off), DeviceBuffer(0x9000), count, coll.F32, Options{Algorithm: coll.OneShot})
	})...); err != nil {
		t.Fatal(err)
	}
	for r, d := range devs {
		var a collectives.ArgsW2
		binary.Read(bytes.NewReader(d.launches[0].args), binary.LittleEndian, &a)
		if a.SlotBytes != 0 {
			t.Errorf("rank %d: slot bytes %d, want 0 (zero-copy)", r, a.SlotBytes)
		}
		for p := range 2 {
			input := uint64(fakeRegion(p)) + 3<<30 + off
			if got := a.Stage[p] + uint64(p)*a.Chunk*4; got != input {
				t.Errorf("rank %d: stage[%d] + chunk %d = %#x, want rank %d's input %#x", r, p, p, got, p, input)
			}
		}
	}
	// Staged (plain device memory): both slots, the staging area.
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		return c.AllGather(DeviceBuffer(0x1000), DeviceBuffer(0x9000), count, coll.F32, Options{Algorithm: coll.OneShot})
	})...); err != nil {
		t.Fatal(err)
	}
	var a collectives.ArgsW2
	binary.Read(bytes.NewReader(devs[0].launches[1].args), binary.LittleEndian, &a)
	if a.SlotBytes == 0 || a.Stage[1] < uint64(fakeRegion(1)) || a.Stage[1] >= uint64(fakeRegion(1))+3<<30 {
		t.Errorf("staged call: slot bytes %d, stage %#x; want the staging area", a.SlotBytes, a.Stage)
	}
}

// TestFakeZeroCopyOneRound: a one-shot all-reduce larger than the staging
// buffer runs in rounds over windows that fit it when staged, and in one
// round when its input is symmetric (read in place, nothing staged).
// Two-shot reduces into scratch, which zero-copy does not replace and
// whose layout then follows the input's: refused, naming the scratch area.
func TestFakeZeroCopyOneRound(t *testing.T) {
	comms, devs := fakeComms(t, 2, Config{StagingBytes: 1 << 20})
	defer closeAll(t, comms)
	const n = 1 << 20 // f32: 4 MiB, over the 1 MiB staging buffer
	syms := allocOnRanks(t, comms, 4*n)
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), n, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
	})...); err != nil {
		t.Fatalf("staged 4 MiB one-shot over a 1 MiB staging buffer: %v", err)
	}
	var a collectives.ArgsW2
	binary.Read(bytes.NewReader(devs[0].launches[0].args), binary.LittleEndian, &a)
	if a.Chunk != n/2 || a.Window != (1<<20)/(2*4) || a.SlotBytes == 0 {
		t.Errorf("staged call: chunk %d, window %d, slot bytes %d; want chunk %d in windows of %d (2 chunks of f32 in the 1 MiB area)", a.Chunk, a.Window, a.SlotBytes, n/2, (1<<20)/(2*4))
	}
	devs[0].launches = nil
	if err := comms[0].AllReduce(DeviceBuffer(syms[0]), DeviceBuffer(0x9000), n, coll.F32, coll.Sum, Options{Algorithm: coll.TwoShot}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "scratch area") {
		t.Errorf("zero-copy 4 MiB two-shot over a 1 MiB scratch area: %v, want ErrInvalidArgument naming the scratch area", err)
	}
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		return c.AllReduce(DeviceBuffer(syms[r]), DeviceBuffer(0x9000), n, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
	})...); err != nil {
		t.Fatalf("zero-copy 4 MiB one-shot: %v", err)
	}
	if len(devs[0].launches) != 1 || devs[0].launches[0].kernel.Algorithm != coll.OneShot {
		t.Fatalf("launches %v, want one one-shot kernel", devs[0].launches)
	}
	binary.Read(bytes.NewReader(devs[0].launches[0].args), binary.LittleEndian, &a)
	if a.Window != a.Chunk || a.SlotBytes != 0 {
		t.Errorf("zero-copy call: window %d of a %d-element chunk, slot bytes %d; want one round (window = chunk) and one slot", a.Window, a.Chunk, a.SlotBytes)
	}
}

// TestFakeSymmetricRules: the shipped rules send a 128 MiB all-reduce
// with a symmetric input to the in-place one-shot (one round, nothing
// staged) and the same call staged to the two-shot LL128 in rounds through
// its inbox; Explain reports both plans. (At world 2 the plain
// rules send up to 8 MiB to twoshot_ll128, symmetric or not: they come
// first.)
func TestFakeSymmetricRules(t *testing.T) {
	comms, devs := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	const n = 32 << 20 // f32: 128 MiB
	syms := allocOnRanks(t, comms, 4*n)
	p, err := comms[0].Explain(coll.AllReduce, DeviceBuffer(syms[0]), DeviceBuffer(0x9000), n, coll.F32, coll.Sum, Options{})
	if err != nil || p != (Plan{Algorithm: coll.OneShot, Kernel: "allreduce_oneshot_f32_sum_w2", ZeroCopy: true, Rounds: 1}) {
		t.Errorf("symmetric 128 MiB: plan %+v, %v; want the zero-copy one-shot in one round", p, err)
	}
	p, err = comms[0].Explain(coll.AllReduce, DeviceBuffer(0x1000), DeviceBuffer(0x9000), n, coll.F32, coll.Sum, Options{})
	k, _ := collectives.Library.Kernel(coll.AllReduce, coll.TwoShotLL128, coll.F32, coll.Sum, 2)
	window := pushWindow(comms[0].gpu.area[coll.LL128], k, n/2, 4)
	if rounds := (int64(n/2) + window - 1) / window; err != nil || p != (Plan{Algorithm: coll.TwoShotLL128, Kernel: "allreduce_twoshot_ll128_f32_sum_w2", Rounds: rounds}) || rounds < 10 {
		t.Errorf("staged 128 MiB: plan %+v, %v; want the staged two-shot LL128 in %d rounds", p, err, rounds)
	}
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		return c.AllReduce(DeviceBuffer(syms[r]), DeviceBuffer(0x9000), n, coll.F32, coll.Sum, Options{})
	})...); err != nil {
		t.Fatal(err)
	}
	if len(devs[0].launches) != 1 || devs[0].launches[0].kernel.Algorithm != coll.OneShot || len(devs[0].nccl) != 0 {
		t.Errorf("launches %d, nccl calls %v; want one one-shot kernel", len(devs[0].launches), devs[0].nccl)
	}
}

// allocOnRanks makes a symmetric buffer of bytes on every rank (Alloc is
// collective) and returns each rank's base.
func allocOnRanks(t testing.TB, comms []*Communicator, bytes int) []cuda.DevicePtr {
	t.Helper()
	syms := make([]cuda.DevicePtr, len(comms))
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) (err error) {
		syms[r], err = c.Alloc(context.Background(), bytes)
		return err
	})...); err != nil {
		t.Fatal(err)
	}
	return syms
}

// TestFakeLargeStagingStillRounds: a staging buffer larger than the
// message (Config.StagingBytes) does not make a large staged barrier call
// run in one round: it runs in windows of kernels.WindowBytes, as with the
// default staging; a message that fits one window stays one round.
func TestFakeLargeStagingStillRounds(t *testing.T) {
	comms, _ := fakeComms(t, 2, Config{StagingBytes: 512 << 20})
	defer closeAll(t, comms)
	for _, c := range []struct {
		n      int // f32 elements
		rounds int64
	}{
		{64 << 20, 32}, // 256 MiB in 8 MiB windows
		{1 << 20, 1},   // 4 MiB: one round
	} {
		p, err := comms[0].Explain(coll.AllReduce, DeviceBuffer(0x1000), DeviceBuffer(1<<40), c.n, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
		if err != nil || p.Rounds != c.rounds {
			t.Errorf("one-shot %d bytes through a 512 MiB area: plan %+v, %v; want %d rounds", 4*c.n, p, err, c.rounds)
		}
	}
}

// TestFakePushFallsBackToRounds: with a staging area too small for a push
// kernel's inbox, an all-reduce's push kernel runs in rounds, automatic or
// forced, and so does a reduce-scatter's push one-shot; in a package where
// that one has no rounds, the automatic choice runs the message on the
// one-shot barrier kernel in rounds (not NCCL), and forcing the push
// kernel is refused.
func TestFakePushFallsBackToRounds(t *testing.T) {
	comms, devs := fakeComms(t, 2, Config{StagingBytes: 1 << 20})
	defer closeAll(t, comms)
	const n = 2 << 20 // bf16: a 4 MiB all-reduce (twoshot_ll128 by the rules)
	// Two chunks of 1M elements; 2 inbox places of 512 KiB hold 4096 LL128
	// lines, 245760 elements each, so 5 rounds of equal windows of 209716
	// (a multiple of the 4-element vector).
	want := Plan{Algorithm: coll.TwoShotLL128, Kernel: "allreduce_twoshot_ll128_bf16_sum_w2", Rounds: 5}
	for _, alg := range []coll.Algorithm{coll.Auto, coll.TwoShotLL128} {
		p, err := comms[0].Explain(coll.AllReduce, DeviceBuffer(0x1000), DeviceBuffer(1<<40), n, coll.BF16, coll.Sum, Options{Algorithm: alg})
		if err != nil || p != want {
			t.Errorf("%s all-reduce 4 MiB over a 1 MiB area: plan %+v, %v; want %+v", alg, p, err, want)
		}
	}
	// The launch carries the window (the kernel derives the rounds).
	if err := errors.Join(onRanks(comms, func(r int, c *Communicator) error {
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x9000), n, coll.BF16, coll.Sum, Options{})
	})...); err != nil {
		t.Fatal(err)
	}
	var a collectives.ArgsW2
	binary.Read(bytes.NewReader(devs[0].launches[0].args), binary.LittleEndian, &a)
	if a.Chunk != n/2 || a.Window != 209716 || a.SlotBytes == 0 {
		t.Errorf("launch: chunk %d, window %d, slot bytes %d; want chunk %d in windows of 209716", a.Chunk, a.Window, a.SlotBytes, n/2)
	}
	// The reduce-scatter's push one-shot runs in rounds too (the aligned
	// split): chunks of 2M elements through one 1 MiB place, 8192 LL128
	// lines of 60 elements (491520 at most), in 5 rounds.
	p, err := comms[0].Explain(coll.ReduceScatter, DeviceBuffer(0x1000), DeviceBuffer(1<<40), n, coll.BF16, coll.Sum, Options{})
	if err != nil || p != (Plan{Algorithm: coll.OneShotLL128, Kernel: "reduce_scatter_oneshot_ll128_bf16_sum_w2", Rounds: 5}) {
		t.Errorf("auto reduce-scatter of 8 MiB (oneshot_ll128 by the rules) over a 1 MiB area: plan %+v, %v; want the push one-shot in 5 rounds", p, err)
	}
	// A package whose push one-shots have no rounds: the automatic choice
	// moves the call to the barrier one-shot, in rounds; forcing the push
	// kernel is refused.
	old, _ := fakeComms(t, 2, Config{StagingBytes: 1 << 20, Library: withoutPushRounds(coll.ReduceScatter)})
	defer closeAll(t, old)
	p, err = old[0].Explain(coll.ReduceScatter, DeviceBuffer(0x1000), DeviceBuffer(1<<40), n, coll.BF16, coll.Sum, Options{})
	if err != nil || p != (Plan{Algorithm: coll.OneShot, Kernel: "reduce_scatter_oneshot_bf16_sum_w2", Rounds: 8}) {
		t.Errorf("auto reduce-scatter of 8 MiB without push rounds over a 1 MiB area: plan %+v, %v; want the one-shot in 8 rounds", p, err)
	}
	_, err = old[0].Explain(coll.ReduceScatter, DeviceBuffer(0x1000), DeviceBuffer(1<<40), n, coll.BF16, coll.Sum, Options{Algorithm: coll.OneShotLL128})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "of inbox") {
		t.Errorf("forced reduce-scatter oneshot_ll128 of 8 MiB without push rounds over a 1 MiB area: %v; want ErrInvalidArgument naming the inbox", err)
	}
}

// withoutPushRounds is the shipped library with the push kernels of one
// collective running in one round only, as in packages generated before
// the reduce-scatter's and all-gather's one-shots had rounds: the paths
// that refuse or move what such a kernel's inbox cannot hold serve them.
func withoutPushRounds(c coll.Collective) *kernels.Library {
	ks := slices.Clone(collectives.Library.Kernels)
	for i := range ks {
		if k := &ks[i]; k.Collective == c && k.Push() {
			k.PushRounds = false
		}
	}
	return shippedWith(ks, nil)
}

// shippedWith is the shipped library with its kernels or its selections
// replaced (nil keeps the shipped ones): a new Library, since one holds
// its lookup index (it must not be copied), with every other exported
// field the shipped one's, a field added to Library later included.
func shippedWith(ks []kernels.Kernel, sels []kernels.Selection) *kernels.Library {
	lib := new(kernels.Library)
	src, dst := reflect.ValueOf(collectives.Library).Elem(), reflect.ValueOf(lib).Elem()
	for i := range src.NumField() {
		if src.Type().Field(i).IsExported() {
			dst.Field(i).Set(src.Field(i))
		}
	}
	if ks != nil {
		lib.Kernels = ks
	}
	if sels != nil {
		lib.Selections = sels
	}
	return lib
}

// TestFakeInPlaceSymmetricStaged: in-place calls on symmetric memory that
// zero-copy kernels cannot read in place are staged: an all-gather whose
// input is out + rank*sendCount (at a different offset on every rank,
// where zero-copy read every peer at this rank's offset: wrong data), and
// an all-reduce with in == out (the one-shot wrote its output while peers
// still read its input). A plain symmetric input with a separate output,
// and an in-place reduce-scatter, still run zero-copy.
func TestFakeInPlaceSymmetricStaged(t *testing.T) {
	comms, _ := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	const count = 4 << 20 // f32 elements per rank
	syms := allocOnRanks(t, comms, 2*4*count)
	for _, c := range []struct {
		name     string
		collect  coll.Collective
		in, out  func(r int) Buffer
		n        int
		zeroCopy bool
	}{
		{"all-gather in place", coll.AllGather, func(r int) Buffer { return DeviceBuffer(syms[r] + cuda.DevicePtr(r*4*count)) }, func(r int) Buffer { return DeviceBuffer(syms[r]) }, count, false},
		{"all-gather, separate output", coll.AllGather, func(r int) Buffer { return DeviceBuffer(syms[r]) }, func(int) Buffer { return DeviceBuffer(0x9000) }, count, true},
		{"all-reduce in place", coll.AllReduce, func(r int) Buffer { return DeviceBuffer(syms[r]) }, func(r int) Buffer { return DeviceBuffer(syms[r]) }, 2 * count, false},
		{"all-reduce, output overlapping", coll.AllReduce, func(r int) Buffer { return DeviceBuffer(syms[r]) }, func(r int) Buffer { return DeviceBuffer(syms[r] + 4) }, count, false},
		{"all-reduce, separate output", coll.AllReduce, func(r int) Buffer { return DeviceBuffer(syms[r]) }, func(int) Buffer { return DeviceBuffer(0x9000) }, 2 * count, true},
		{"reduce-scatter in place", coll.ReduceScatter, func(r int) Buffer { return DeviceBuffer(syms[r]) }, func(r int) Buffer { return DeviceBuffer(syms[r] + cuda.DevicePtr(r*4*count)) }, count, true},
	} {
		for r, cm := range comms {
			p, err := cm.Explain(c.collect, c.in(r), c.out(r), c.n, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
			if err != nil || p.ZeroCopy != c.zeroCopy {
				t.Errorf("%s, rank %d: plan %+v, %v; want zero-copy %v", c.name, r, p, err, c.zeroCopy)
			}
		}
	}
}

// TestFakeMisalignedDeviceBuffer: a device pointer off its element's
// alignment is refused (ErrInvalidArgument) before anything runs; kernels
// load whole elements, and a misaligned address faults the context.
func TestFakeMisalignedDeviceBuffer(t *testing.T) {
	comms, devs := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	for _, c := range []struct {
		in, out cuda.DevicePtr
		dtype   coll.DType
	}{{0x1001, 0x2000, coll.F32}, {0x1000, 0x2003, coll.F32}, {0x1002, 0x2000, coll.F64}, {0x1001, 0x2000, coll.BF16}} {
		err := comms[0].AllReduce(DeviceBuffer(c.in), DeviceBuffer(c.out), 7, c.dtype, coll.Sum, Options{})
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "aligned") {
			t.Errorf("%#x -> %#x %s: %v; want ErrInvalidArgument naming the alignment", uintptr(c.in), uintptr(c.out), c.dtype, err)
		}
	}
	if len(devs[0].launches) != 0 {
		t.Errorf("%d launches for refused calls", len(devs[0].launches))
	}
	// Element-aligned (one element off 16 bytes) is fine: the awkward sizes.
	if _, err := comms[0].Explain(coll.AllReduce, DeviceBuffer(0x1004), DeviceBuffer(0x2004), 7, coll.F32, coll.Sum, Options{}); err != nil {
		t.Errorf("an element-aligned pointer: %v", err)
	}
}
