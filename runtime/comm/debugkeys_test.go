package comm

import (
	"errors"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// TestDebugCheckTaggedCallsLeaveNoStoreKeys: with the debug check on, host
// calls carrying explicit Options.Tag values exchange their fingerprints
// under a per-tag name ("check/tag<n>"); once every rank has closed, the
// group must leave no key in the store (docs/reliability.md, case 74),
// whatever tags its calls used.
func TestDebugCheckTaggedCallsLeaveNoStoreKeys(t *testing.T) {
	t.Setenv(EnvDebugCheck, "1")
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	comms := hostComms(t, st, 2, "tagkeys")
	errs := onRanks(comms, func(r int, c *Communicator) error {
		for _, tag := range []uint64{1, 2, 7} {
			xs := []float32{float32(r), 1}
			if err := AllReduceSlice(c, xs, xs, coll.Sum, Options{Tag: tag}); err != nil {
				return err
			}
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	closeAll(t, comms)
	if left := st.Live(); len(left) > 0 {
		t.Fatalf("%d keys left after every rank closed: %q", len(left), left)
	}
}
