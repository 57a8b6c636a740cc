//go:build cgo

package cuda

// LoadDriverForTest resolves libcuda from the current environment without
// installing it, so tests can check library errors after a real load.
func LoadDriverForTest() error {
	tbl, lib, err := loadDriverFrom(driverSpec())
	if tbl != nil {
		freeTable(tbl)
		lib.Close()
	}
	return err
}

// LoadNVRTCForTest is LoadDriverForTest for NVRTC.
func LoadNVRTCForTest() error {
	tbl, lib, err := loadNVRTCFrom(nvrtcSpec())
	if tbl != nil {
		freeTable(tbl)
		lib.Close()
	}
	return err
}
