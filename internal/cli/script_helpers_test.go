package cli

import (
	"path/filepath"
	"testing"
)

// globScripts returns the script files matching pattern, failing the test
// when there are none (a typo must not make a test pass vacuously).
func globScripts(t *testing.T, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts match %s: %v", pattern, err)
	}
	return files
}
