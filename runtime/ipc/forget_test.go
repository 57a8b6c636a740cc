package ipc

import (
	"context"
	"slices"
	"testing"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// Forget deletes the records of every rank of the key and nothing else
// (Exchange on GPUs: tests/proof TestClosedGroupKeysGPU).
func TestForget(t *testing.T) {
	ctx := context.Background()
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	for r := range 3 {
		st.Set(ctx, recordKey("g/region", r), []byte("{}"))
		st.Set(ctx, recordKey("g/regionx", r), []byte("{}"))
	}
	if err := Forget(ctx, st, "g/region", 3); err != nil {
		t.Fatal(err)
	}
	want := []string{recordKey("g/regionx", 0), recordKey("g/regionx", 1), recordKey("g/regionx", 2)}
	if left := st.Live(); !slices.Equal(left, want) {
		t.Fatalf("left %q, want %q", left, want)
	}
	if err := Forget(ctx, st, "g/region", 3); err != nil {
		t.Fatalf("second Forget: %v", err)
	}
}
