package nccl

// OpenForTest resolves libnccl from the current environment without
// installing it, so tests can check library errors.
func OpenForTest() error {
	tbl, _, err := open(candidates())
	if tbl != nil {
		freeTable(tbl)
	}
	return err
}
