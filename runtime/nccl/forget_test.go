package nccl

import (
	"context"
	"slices"
	"testing"

	"github.com/collgen/collgen/runtime/rendezvous"
	"github.com/collgen/collgen/runtime/rendezvous/storetest"
)

// ForgetID deletes the id published under its key and nothing else (the
// id NewComm publishes on GPUs: tests/proof TestClosedGroupKeysGPU).
func TestForgetID(t *testing.T) {
	ctx := context.Background()
	st := storetest.NewKeyStore(rendezvous.NewMemStore())
	st.Set(ctx, idKey("g/nccl"), make([]byte, UniqueIDSize))
	st.Set(ctx, idKey("g/ncclx"), make([]byte, UniqueIDSize))
	if err := ForgetID(ctx, st, "g/nccl"); err != nil {
		t.Fatal(err)
	}
	if left := st.Live(); !slices.Equal(left, []string{idKey("g/ncclx")}) {
		t.Fatalf("left %q", left)
	}
	if err := ForgetID(ctx, st, "g/nccl"); err != nil {
		t.Fatalf("second ForgetID: %v", err)
	}
}
