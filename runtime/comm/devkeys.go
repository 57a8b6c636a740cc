package comm

import "strconv"

// The store keys a GPU formation's devices exchange live under its
// prefix, so the last rank to leave can name them all whatever its own
// device did (forgetDeviceKeys, forgetHierKeys).

// ncclKey keys the NCCL id (the hierarchical backend's all-rank one too).
func ncclKey(prefix string) string { return prefix + "nccl" }

// regionKey keys the staging region's IPC records.
func regionKey(prefix string) string { return prefix + "region" }

// symmGroup is the group of the symmetric pool behind Alloc.
func symmGroup(prefix string) string { return prefix + "symm" }

// crossKey keys the hierarchical backend's cross-host NCCL id of local
// index me.
func crossKey(prefix string, me int) string { return prefix + "xhost/" + strconv.Itoa(me) }
