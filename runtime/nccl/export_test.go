package nccl

// OpenForTest resolves libnccl from the current environment without
// installing it, so tests can check library errors.
func OpenForTest() error {
	tbl, lib, err := open(spec())
	if tbl != nil {
		freeTable(tbl)
		lib.Close()
	}
	return err
}

// MissingMsg is missingMsg, for the message test.
var MissingMsg = missingMsg
