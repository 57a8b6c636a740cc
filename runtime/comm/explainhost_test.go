package comm

import (
	"errors"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestExplainHostRefusals: Explain "resolves a call exactly as AllReduce,
// ReduceScatter or AllGather would with these arguments". On a host
// communicator an algorithm the host cannot run (a push protocol's, or
// hcm at a world size it has no schedule for) is refused by the call with
// ErrInvalidArgument; Explain must refuse it too, not report a plan.
func TestExplainHostRefusals(t *testing.T) {
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "explainhost")
	defer closeAll(t, comms)
	b := HostBuffer(make([]byte, 64))
	for _, alg := range []coll.Algorithm{coll.OneShotLL, coll.TwoShotLL128, coll.OneShotLamport, coll.HCM} {
		errs := onRanks(comms, func(_ int, c *Communicator) error {
			return c.AllReduce(b, b, 4, coll.F32, coll.Sum, Options{Algorithm: alg})
		})
		if !errors.Is(errs[0], ErrInvalidArgument) {
			t.Fatalf("%s: the call: %v; want ErrInvalidArgument", alg, errs[0])
		}
		p, err := comms[0].Explain(coll.AllReduce, b, b, 4, coll.F32, coll.Sum, Options{Algorithm: alg})
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: Explain = %+v, %v; the call refuses it (%v)", alg, p, err, errs[0])
		}
	}
	// What the host runs still plans.
	if p, err := comms[0].Explain(coll.AllReduce, b, b, 4, coll.F32, coll.Sum, Options{Algorithm: coll.TwoShot}); err != nil || p.Algorithm != coll.TwoShot {
		t.Errorf("twoshot: Explain = %+v, %v", p, err)
	}
}
