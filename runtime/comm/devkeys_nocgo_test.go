//go:build !cgo || !(linux && (amd64 || arm64))

package comm

// forgetsDeviceKeys: without cgo no device opens, so forgetDeviceKeys and
// forgetHierKeys delete nothing (the packages that name those keys need
// cgo), while the tests' fake devices publish keys all the same.
const forgetsDeviceKeys = false
