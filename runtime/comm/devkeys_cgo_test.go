//go:build cgo && linux && (amd64 || arm64)

package comm

// forgetsDeviceKeys: this build's forgetDeviceKeys and forgetHierKeys
// delete the keys devices publish (NCCL ids, IPC records, pools), which the
// fake devices of the tests publish too.
const forgetsDeviceKeys = true
