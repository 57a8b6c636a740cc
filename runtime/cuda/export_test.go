//go:build cgo

package cuda

// LoadDriverForTest resolves libcuda from the current environment without
// installing it, so tests can check library errors after a real load.
func LoadDriverForTest() error {
	tbl, _, err := loadDriverFrom(driverCandidates())
	if tbl != nil {
		freeTable(tbl)
	}
	return err
}

// LoadNVRTCForTest is LoadDriverForTest for NVRTC.
func LoadNVRTCForTest() error {
	tbl, _, err := loadNVRTCFrom(nvrtcCandidates())
	if tbl != nil {
		freeTable(tbl)
	}
	return err
}
