package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/topo"
)

// healthy is a machine where every check passes: 2 GPUs over NVSwitch,
// NCCL 2.28, plenty of /dev/shm.
func healthy() doctorProbes {
	return doctorProbes{
		driver: func() (string, int, int, error) { return "libcuda.so.1", 13000, 2, nil },
		nvrtc:  func() (int, int, string, error) { return 13, 0, "libnvrtc.so.13", nil },
		nccl: func() (ncclFound, error) {
			return ncclFound{version: "2.28.3", path: "libnccl.so.2", registers: true, windows: true}, nil
		},
		topology: func() (*topo.Classification, error) {
			return &topo.Classification{Kind: topo.NVSwitch, GPUs: []topo.BusID{{Bus: 0x18}, {Bus: 0x2a}}, Reason: "every pair through NVSwitch"}, nil
		},
		shmFree:   func() (int64, error) { return 64 << 30, nil },
		underMPS:  func() bool { return false },
		cache:     func() (string, string, error) { return "/c", "3 entries", nil },
		getenv:    func(string) string { return "" },
		lookupEnv: func(string) (string, bool) { return "", false },
	}
}

// Each check's verdict, and collgen doctor's exit status: 1 only when a
// GPU communicator cannot be made (no driver, no GPU); what it may do
// without (NVRTC, NCCL, NVML, a small /dev/shm, too few work queues, the
// cache) is a warning that says what to do.
func TestDoctor(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(p *doctorProbes)
		check string // the check's name
		want  string // its verdict
		text  string // in its line
		exit  int
	}{
		{"healthy", func(p *doctorProbes) {}, "nccl", checkOK, "NCCL 2.28.3 (libnccl.so.2): collectives, buffer registration and windows", 0},
		{"no driver", func(p *doctorProbes) {
			p.driver = func() (string, int, int, error) { return "", 0, 0, errors.New("cuda: cannot load libcuda") }
		}, "driver", checkFail, "cannot load libcuda", 1},
		{"no GPU", func(p *doctorProbes) {
			p.driver = func() (string, int, int, error) { return "libcuda.so.1", 12040, 0, nil }
		},
			"driver", checkFail, "CUDA 12.4) sees no GPU", 1},
		{"no GPU visible", func(p *doctorProbes) {
			p.driver = func() (string, int, int, error) { return "", 0, 0, errors.New("cuda: cuInit: CUDA_ERROR_NO_DEVICE") }
			p.lookupEnv = func(name string) (string, bool) { return "", name == "CUDA_VISIBLE_DEVICES" }
		}, "driver", checkFail, `CUDA_ERROR_NO_DEVICE (CUDA_VISIBLE_DEVICES="")`, 1},
		{"work queues set by the driver's load", func(p *doctorProbes) {
			set := false
			p.driver = func() (string, int, int, error) { set = true; return "libcuda.so.1", 13000, 2, nil }
			p.getenv = func(string) string {
				if set {
					return "32"
				}
				return ""
			}
		}, "work queues", checkOK, "unset: collgen sets 32", 0},
		{"no NVRTC", func(p *doctorProbes) {
			p.nvrtc = func() (int, int, string, error) { return 0, 0, "", errors.New("cuda: cannot load libnvrtc") }
		}, "nvrtc", checkWarn, "kernels load only from a fatbin", 0},
		{"no NCCL", func(p *doctorProbes) {
			p.nccl = func() (ncclFound, error) { return ncclFound{}, errors.New("cannot load libnccl") }
		}, "nccl", checkWarn, "cannot load libnccl", 0},
		{"old NCCL", func(p *doctorProbes) {
			p.nccl = func() (ncclFound, error) { return ncclFound{version: "2.18.1", path: "libnccl.so.2"}, nil }
		}, "nccl", checkWarn, "collectives only; buffer registration needs 2.19", 0},
		{"NCCL without windows", func(p *doctorProbes) {
			p.nccl = func() (ncclFound, error) {
				return ncclFound{version: "2.21.5", path: "libnccl.so.2", registers: true}, nil
			}
		}, "nccl", checkOK, "windows (Config.NCCLWindows) need 2.27", 0},
		{"no NVML", func(p *doctorProbes) {
			p.topology = func() (*topo.Classification, error) { return nil, errors.New("topo: nvmlInit: not found") }
		}, "topology", checkWarn, "nvmlInit", 0},
		{"small /dev/shm", func(p *doctorProbes) { p.shmFree = func() (int64, error) { return 64 << 20, nil } },
			"/dev/shm", checkWarn, "64.0 MiB free", 0},
		{"few work queues", func(p *doctorProbes) { p.getenv = func(string) string { return "8" } },
			"work queues", checkWarn, "CUDA_DEVICE_MAX_CONNECTIONS=8: goroutine ranks sharing one GPU need 32", 0},
		{"MPS", func(p *doctorProbes) {
			p.getenv = func(string) string { return "8" }
			p.underMPS = func() bool { return true }
		}, "work queues", checkOK, "an MPS control daemon runs", 0},
		{"no cache", func(p *doctorProbes) {
			p.cache = func() (string, string, error) { return "", "", errors.New("no home") }
		},
			"kernel cache", checkWarn, "NVRTC then compiles every kernel at every New", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := healthy()
			tc.edit(&p)
			var found bool
			for _, c := range p.diagnose() {
				if c.Name != tc.check { // its probe is the healthy one
					if c.Verdict != checkOK {
						t.Errorf("%s: %s %s", c.Name, c.Verdict, c.Detail)
					}
					continue
				}
				found = true
				if c.Verdict != tc.want || !strings.Contains(c.Detail, tc.text) {
					t.Errorf("%s: %s %q; want %s containing %q", c.Name, c.Verdict, c.Detail, tc.want, tc.text)
				}
			}
			if !found {
				t.Fatalf("no %s check", tc.check)
			}
			var out bytes.Buffer
			cmd := newCmdDoctor(&IO{Out: &out, Err: &out}, p)
			cmd.SetArgs(nil)
			err := cmd.Execute()
			var ee *ExitError
			if code := map[bool]int{true: 1, false: 0}[errors.As(err, &ee) && ee.Code == 1]; code != tc.exit || (err != nil && ee == nil) {
				t.Errorf("exit: %v, want status %d", err, tc.exit)
			}
			if !strings.Contains(out.String(), tc.check) || strings.Count(out.String(), "\n") != 7 {
				t.Errorf("report:\n%s", out.String())
			}
		})
	}
}
