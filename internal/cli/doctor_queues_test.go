package cli

import (
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/cuda"
)

// collgen doctor's work-queue line agrees with what runtime/cuda gives a
// context (and so with comm.New's refusal of goroutine ranks sharing one
// GPU with fewer than 32): a value CUDA does not take (above 32, or set
// but empty) leaves CUDA's default 8, and an empty value is not "unset"
// (askWorkQueues keeps a variable the process set, even to "").
func TestDoctorWorkQueuesAsTheRuntimeReads(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		set   bool
		want  string
		text  string
	}{
		{"unset", "", false, checkOK, "unset: collgen sets 32"},
		{"32", "32", true, checkOK, "CUDA_DEVICE_MAX_CONNECTIONS=32"},
		{"above CUDA's range", "64", true, checkWarn, "CUDA_DEVICE_MAX_CONNECTIONS=64"},
		{"set but empty", "", true, checkWarn, `CUDA_DEVICE_MAX_CONNECTIONS=""`},
		{"not a number", "lots", true, checkWarn, "CUDA_DEVICE_MAX_CONNECTIONS=lots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := healthy()
			env := func(name string) (string, bool) {
				if name == cuda.EnvMaxConnections && tc.set {
					return tc.value, true
				}
				return "", false
			}
			p.lookupEnv = env
			p.getenv = func(name string) string { v, _ := env(name); return v }
			for _, c := range p.diagnose() {
				if c.Name != "work queues" {
					continue
				}
				if c.Verdict != tc.want || !strings.Contains(c.Detail, tc.text) {
					t.Errorf("%s %q; want %s containing %q", c.Verdict, c.Detail, tc.want, tc.text)
				}
			}
		})
	}
}
