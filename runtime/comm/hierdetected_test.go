package comm

import (
	"errors"
	"testing"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// Detected documents "the topology in use" (Topology "" meaning no
// generated kernel runs and every collective goes to NCCL). On a group
// spanning hosts of two GPUs each, the host steps run the nested host
// communicator's generated kernels, yet Detected reports nothing.
func TestHierDetected(t *testing.T) {
	comms, _, errs := hierComms(t, rendezvous.NewMemStore(), []string{"a", "b", "a", "b"}, Config{})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	inner := comms[0].hier.intra.Detected()
	if inner.Topology == "" {
		t.Fatalf("the host communicator chose no topology: %+v", inner)
	}
	if d := comms[0].Detected(); d.Topology != inner.Topology {
		t.Errorf("Detected() = %+v; the host steps run topology %q (%s)", d, inner.Topology, inner.Kind)
	}
}
