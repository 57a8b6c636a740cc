//go:build !cgo || !(linux && (amd64 || arm64))

package comm

import (
	"context"

	"github.com/collgen/collgen/runtime/rendezvous"
)

// forgetDeviceKeys has nothing to delete without cgo: no device opens
// (openDevice fails before the formation's first exchange), so no rank
// reached NCCL, the region or a pool, and the store has no device keys.
func forgetDeviceKeys(context.Context, rendezvous.Store, string, int) {}

// forgetHierKeys is forgetDeviceKeys across hosts (openHierDevice fails).
func forgetHierKeys(context.Context, rendezvous.Store, string, int) {}
