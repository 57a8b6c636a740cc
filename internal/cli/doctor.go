package cli

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/topo"
)

func init() {
	register("doctor", func(io *IO) *cobra.Command { return newCmdDoctor(io, realProbes()) })
}

// A doctorCheck's verdicts: ok, warn (GPU collectives run, but something
// they may use is missing or unusual), fail (a GPU communicator cannot be
// made on this machine).
const (
	checkOK   = "ok"
	checkWarn = "warn"
	checkFail = "fail"
)

// doctorCheck is one line of collgen doctor's report.
type doctorCheck struct {
	Verdict string // checkOK, checkWarn or checkFail
	Name    string // what was checked
	Detail  string // what was found, and what to do where it is not ok
}

// doctorProbes is what collgen doctor reads from the machine; tests fake
// it. Every function reports what it found or why it could not.
type doctorProbes struct {
	// driver returns libcuda's path, the driver's CUDA version (e.g.
	// 13000) and the GPU count.
	driver func() (path string, version, gpus int, err error)
	// nvrtc returns NVRTC's version and path.
	nvrtc func() (major, minor int, path string, err error)
	// nccl returns libnccl's version, path and what it can do beyond
	// collectives (nccl.Lib.Registers, HasWindows).
	nccl func() (nccl ncclFound, err error)
	// topology classifies every GPU of the machine through NVML.
	topology func() (*topo.Classification, error)
	// shmFree returns the bytes free in /dev/shm.
	shmFree func() (int64, error)
	// underMPS reports whether an MPS control daemon runs.
	underMPS func() bool
	// cache returns the kernel cache's directory and its usage line.
	cache func() (dir, usage string, err error)
	// getenv and lookupEnv read the environment.
	getenv    func(string) string
	lookupEnv func(string) (string, bool)
}

// ncclFound is the NCCL library doctor loaded.
type ncclFound struct {
	version, path      string // e.g. "2.28.3", "libnccl.so.2"
	registers, windows bool   // nccl.Lib.Registers, HasWindows
}

// shmLow is the /dev/shm free space below which doctor warns: the host
// backend's and host symmetric memory's segments live there, and a
// container's default 64 MiB holds few of them.
const shmLow = 256 << 20

// diagnose runs every check, in the report's order.
func (p doctorProbes) diagnose() []doctorCheck {
	var out []doctorCheck
	add := func(verdict, name, format string, args ...any) {
		out = append(out, doctorCheck{verdict, name, fmt.Sprintf(format, args...)})
	}
	// Read before the driver loads: loading it sets the variable to 32
	// where the process left it unset.
	queues := p.getenv(cuda.EnvMaxConnections)
	_, queuesSet := p.lookupEnv(cuda.EnvMaxConnections)
	queuesSet = queuesSet || queues != ""
	visible := ""
	if v, ok := p.lookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		visible = fmt.Sprintf(" (CUDA_VISIBLE_DEVICES=%q)", v)
	}
	path, version, gpus, err := p.driver()
	switch {
	case err != nil:
		add(checkFail, "driver", "%v%s", err, visible)
	case gpus == 0:
		add(checkFail, "driver", "%s (CUDA %s) sees no GPU%s: check CUDA_VISIBLE_DEVICES and nvidia-smi", path, cudaVersion(version), visible)
	default:
		add(checkOK, "driver", "%s, CUDA %s, %d GPU(s)", path, cudaVersion(version), gpus)
	}
	if major, minor, path, err := p.nvrtc(); err != nil {
		add(checkWarn, "nvrtc", "%v; without NVRTC, kernels load only from a fatbin (collgen fatbin, Config.Fatbin)", err)
	} else {
		add(checkOK, "nvrtc", "NVRTC %d.%d (%s)", major, minor, path)
	}
	if n, err := p.nccl(); err != nil {
		add(checkWarn, "nccl", "%v", err)
	} else {
		v := fmt.Sprintf("NCCL %s (%s)", n.version, n.path)
		switch {
		case !n.registers:
			add(checkWarn, "nccl", "%s: collectives only; buffer registration needs 2.19, windows 2.27", v)
		case !n.windows:
			add(checkOK, "nccl", "%s: collectives and buffer registration; windows (Config.NCCLWindows) need 2.27", v)
		default:
			add(checkOK, "nccl", "%s: collectives, buffer registration and windows", v)
		}
	}
	if c, err := p.topology(); err != nil {
		add(checkWarn, "topology", "%v", err)
	} else {
		add(checkOK, "topology", "%d GPU(s): %s (%s); collgen topo shows the links", len(c.GPUs), c.Kind, c.Reason)
	}
	if free, err := p.shmFree(); err != nil {
		add(checkWarn, "/dev/shm", "%v; host ranks and host symmetric memory need it", err)
	} else if free < shmLow {
		add(checkWarn, "/dev/shm", "%s free: host ranks may fail to set up (ENOSPC); in a container, raise --shm-size", fmtBytes(free))
	} else {
		add(checkOK, "/dev/shm", "%s free", fmtBytes(free))
	}
	switch q := queues; {
	case p.underMPS():
		add(checkOK, "work queues", "an MPS control daemon runs: collgen leaves %s as it is (%q); run one process per rank", cuda.EnvMaxConnections, q)
	case !queuesSet:
		add(checkOK, "work queues", "%s unset: collgen sets 32 before CUDA starts", cuda.EnvMaxConnections)
	default:
		// As runtime/cuda reads it: a value the process set is kept, and
		// one CUDA does not take (empty, not a number, above 32) leaves
		// CUDA's default 8 queues.
		if n, err := strconv.Atoi(q); err != nil || n != cuda.MaxWorkQueues {
			shown := q
			if q == "" {
				shown = `""`
			}
			add(checkWarn, "work queues", "%s=%s: goroutine ranks sharing one GPU need %d (New refuses fewer there; CUDA reads a value outside 1..%d as its default 8)", cuda.EnvMaxConnections, shown, cuda.MaxWorkQueues, cuda.MaxWorkQueues)
		} else {
			add(checkOK, "work queues", "%s=%s", cuda.EnvMaxConnections, q)
		}
	}
	if dir, usage, err := p.cache(); err != nil {
		add(checkWarn, "kernel cache", "%v; NVRTC then compiles every kernel at every New", err)
	} else {
		add(checkOK, "kernel cache", "%s: %s", dir, usage)
	}
	return out
}

// cudaVersion formats a driver version code (13000) as 13.0.
func cudaVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// fmtBytes formats n in MiB or GiB with one decimal.
func fmtBytes(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// realProbes reads this machine.
func realProbes() doctorProbes {
	return doctorProbes{
		driver: func() (string, int, int, error) {
			v, err := cuda.DriverVersion()
			if err != nil {
				return "", 0, 0, err
			}
			n, err := cuda.DeviceCount()
			return cuda.DriverPath(), v, n, err
		},
		nvrtc: cuda.NVRTCVersion,
		nccl:  ncclProbe,
		topology: func() (*topo.Classification, error) {
			m, err := topo.Open()
			if err != nil {
				return nil, err
			}
			return m.Classify()
		},
		shmFree: func() (int64, error) {
			var st syscall.Statfs_t
			if err := syscall.Statfs("/dev/shm", &st); err != nil {
				return 0, fmt.Errorf("statfs /dev/shm: %w", err)
			}
			return int64(st.Bavail) * st.Bsize, nil
		},
		underMPS: cuda.UnderMPS,
		cache: func() (string, string, error) {
			dir, err := cuda.DefaultCacheDir()
			if err != nil {
				return "", "", err
			}
			u, err := (&cuda.Cache{Dir: dir}).Usage()
			if err != nil {
				return dir, "", err
			}
			return dir, u.String(), nil
		},
		getenv:    os.Getenv,
		lookupEnv: os.LookupEnv,
	}
}

// newCmdDoctor builds `collgen doctor` over probes.
func newCmdDoctor(io *IO, probes doctorProbes) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check what this machine gives collgen: driver, NVRTC, NCCL, topology, /dev/shm, work queues, kernel cache",
		Long: `Doctor loads what a GPU communicator would (libcuda, NVRTC, libnccl,
NVML) and reads what it depends on (/dev/shm, CUDA_DEVICE_MAX_CONNECTIONS and
MPS, the kernel cache), and prints one line each: ok, warn (collectives run,
but something they may use is missing or unusual: say what to do), or fail
(a GPU communicator cannot be made here). It exits 1 when a check fails.
Host ranks (comm.Host) need none of the GPU libraries.`,
		Example: `  collgen doctor`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			failed := 0
			for _, c := range probes.diagnose() {
				fmt.Fprintf(io.Out, "%-5s %-13s %s\n", c.Verdict, c.Name, c.Detail)
				if c.Verdict == checkFail {
					failed++
				}
			}
			if failed > 0 {
				return &ExitError{Code: 1, Err: fmt.Errorf("doctor: %d check(s) failed: GPU communicators cannot be made on this machine (host ranks, comm.Host, still run)", failed)}
			}
			return nil
		},
	}
}
