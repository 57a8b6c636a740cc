package proof

import (
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/schedule"
)

// TestProofSizesFit checks on CPU, for every kernel at every world the
// library has, that the counts the GPU proofs force on it fit the staging
// they give it: the runtime refuses a forced push kernel without rounds
// whose inbox cannot hold the message, so a count that does not fit fails
// the proof on the GPU instead of proving the kernel (world 8's zero-copy
// proof did so with a 4 MiB buffer, and hcm's with a message larger than
// its scratch). And each barrier kernel's large
// zero-copy message must exceed the whole zero-copy buffer, or it proves
// nothing staging could not do.
func TestProofSizesFit(t *testing.T) {
	for _, c := range collectives.Combinations {
		k, ok := collectives.Library.Kernel(c.Collective, c.Algorithm, c.DType, c.Op, c.World)
		if !ok {
			t.Fatalf("%s: not in the library", c.Kernel)
		}
		size := int64(c.DType.Size())
		// need is the inbox a forced call of count n asks for.
		need := func(n int) int64 {
			in, out := sizes(c.Collective, c.World, n)
			full := int64(max(in, out))
			chunk := int64(schedule.ChunkElems(c.Collective, int(full), c.World, int(k.VecElems(int(size)))))
			return k.SlotBytes(full*size, chunk*size)
		}
		if k.Push() && !k.PushRounds {
			for _, large := range []bool{false, true} {
				for _, pc := range cases(c.Collective, c.World, large) {
					if b := need(pc.n); b > stagingBytes {
						t.Errorf("%s: proof count %d needs %d inbox bytes, more than stagingBytes (%d)", c.Kernel, pc.n, b, int64(stagingBytes))
					}
				}
			}
			if _, ok := specials[c.DType]; ok && c.Collective.Reduces() {
				if n := specialCount(c.Collective, c.World); need(n) > specialStaging {
					t.Errorf("%s: the special-values count %d needs %d inbox bytes, more than specialStaging (%d)", c.Kernel, n, need(n), int64(specialStaging))
				}
			}
		}
		for _, run := range zeroCopyCounts(c, c.World) {
			switch in, out := sizes(c.Collective, c.World, run.n); {
			case k.Push() && !k.PushRounds && need(run.n) > zcStaging:
				t.Errorf("%s: zero-copy count %d needs %d inbox bytes, more than zcStaging (%d)", c.Kernel, run.n, need(run.n), int64(zcStaging))
			case k.UsesScratch && int64(max(in, out)*k.ScratchElemBytes(c.DType)) > zcStaging:
				// Scratch (two-shot's, hcm's) is the size of an area.
				t.Errorf("%s: zero-copy count %d (%d scratch bytes) exceeds the scratch it reduces into (%d)", c.Kernel, run.n, max(in, out)*k.ScratchElemBytes(c.DType), int64(zcStaging))
			case run.big && int64(in)*size <= zcStaging:
				t.Errorf("%s: the large zero-copy count %d (%d input bytes) fits zcStaging (%d)", c.Kernel, run.n, int64(in)*size, int64(zcStaging))
			}
		}
	}
}

// TestSpecialCombos checks the combinations TestSpecialValues runs at
// every world the library has: all of them up to allComboWorlds, each
// once; beyond it, every ordered pair of specials on every ordered pair of
// ranks, the whole period within a few MB of f64 a rank.
func TestSpecialCombos(t *testing.T) {
	worlds := map[int]bool{}
	for _, c := range collectives.Combinations {
		worlds[c.World] = true
	}
	ns := len(specialNames)
	for w := range worlds {
		combos := specialCombos(w)
		if b := specialCount(coll.AllReduce, w) * 8; b > 4<<20 {
			t.Errorf("world %d: %d bytes of f64 a rank", w, b)
		}
		seen := map[string]bool{}
		pairs := map[[4]int]bool{} // rank p, rank q, special at p, special at q
		for i := range combos {
			key := make([]byte, w)
			for r := range w {
				key[r] = byte(specialIndex(i, r, w))
				for q := range w {
					pairs[[4]int{r, q, specialIndex(i, r, w), specialIndex(i, q, w)}] = true
				}
			}
			if w <= allComboWorlds && seen[string(key)] {
				t.Fatalf("world %d: combination %v twice in one period", w, key)
			}
			seen[string(key)] = true
		}
		if w <= allComboWorlds && len(seen) != combos {
			t.Errorf("world %d: %d distinct combinations, want %d", w, len(seen), combos)
		}
		for p := range w {
			for q := range w {
				for a := range ns {
					for b := range ns {
						if (p != q || a == b) && !pairs[[4]int{p, q, a, b}] {
							t.Fatalf("world %d: no element with %s on rank %d and %s on rank %d", w, specialNames[a], p, specialNames[b], q)
						}
					}
				}
			}
		}
		for a := range ns { // every rank the same special, for each
			key := strings.Repeat(string(rune(a)), w)
			if !seen[key] {
				t.Errorf("world %d: no element with %s on every rank", w, specialNames[a])
			}
		}
	}
}
