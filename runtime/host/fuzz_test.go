package host

import (
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/numeric"
)

// FuzzHostCollectives runs up to four collectives of any kind, algorithm,
// dtype, op, count (0 to about 100 thousand elements), placement (in
// place or not, 0-3 elements off a 64-byte boundary) on a fresh group of
// 2-4 goroutine ranks with small slots (4-64 KiB, so messages go in many
// pieces) and 1-3 lanes, each checked by runOp against the reference with
// guard bytes around every buffer.
func FuzzHostCollectives(f *testing.F) {
	f.Add(uint8(0), uint8(1), uint8(0), []byte{0, 0, 0, 0, 10, 0, 1, 2, 1, 1, 200, 3})
	f.Add(uint8(2), uint8(0), uint8(2), []byte{2, 3, 1, 2, 255, 255, 1, 5, 2, 0, 7, 1})
	f.Fuzz(func(t *testing.T, w, slot, lanes uint8, spec []byte) {
		world := 2 + int(w)%3
		cfg := Config{SlotBytes: 4 << 10 << (int(slot) % 5), Lanes: 1 + int(lanes)%3}
		var ops []op
		for i := 0; i+5 < len(spec) && len(ops) < 4; i += 6 {
			o := op{
				dtype:   numeric.DTypes[int(spec[i+1])%len(numeric.DTypes)],
				red:     coll.Ops()[int(spec[i+2])%len(coll.Ops())],
				count:   (int(spec[i+3])<<8 | int(spec[i+4])) * (1 + int(spec[i+5])%2),
				inPlace: spec[i+5]&2 != 0,
				offset:  int(spec[i+5]>>2) % 4,
				seed:    i + 1,
				alg:     coll.OneShot,
			}
			switch spec[i] % 4 {
			case 0:
				o.coll = coll.AllReduce
			case 1:
				o.coll, o.alg = coll.AllReduce, coll.TwoShot
			case 2:
				o.coll, o.count = coll.ReduceScatter, o.count/world
			default:
				o.coll, o.count = coll.AllGather, o.count/world
			}
			ops = append(ops, o)
		}
		if len(ops) == 0 {
			return
		}
		runOps(t, world, cfg, ops)
	})
}
