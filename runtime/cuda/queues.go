package cuda

import (
	"os"
	"path/filepath"
	"strconv"
)

// EnvMaxConnections is CUDA's environment variable for the hardware work
// queues (connections) from the host to a device that each CUDA context
// gets; the driver reads it when it creates a context. Streams beyond
// that many share queues, and work on one queue starts in the order it
// was queued: where goroutine ranks share one GPU (one context), a
// rank's collective queued behind another rank's, on one queue, waits for
// it, and that one waits for the first rank: a deadlock until the
// kernels' timeout (docs/reliability.md, case 34).
const EnvMaxConnections = "CUDA_DEVICE_MAX_CONNECTIONS"

// MaxWorkQueues is the most work queues CUDA gives a context (the upper
// bound of CUDA_DEVICE_MAX_CONNECTIONS), and what this package asks for
// before it initializes the driver when the variable is unset.
const MaxWorkQueues = 32

// defaultWorkQueues is what CUDA gives a context when the variable is
// unset or out of its range.
const defaultWorkQueues = 8

// workQueuesFrom is how many work queues a context gets for the
// variable's value v (set: whether it is set): CUDA's default 8 when it is
// unset or not a number from 1 to 32.
func workQueuesFrom(v string, set bool) int {
	n, err := strconv.Atoi(v)
	if !set || err != nil || n < 1 || n > MaxWorkQueues {
		return defaultWorkQueues
	}
	return n
}

// askWorkQueues sets CUDA_DEVICE_MAX_CONNECTIONS to MaxWorkQueues unless
// the process set it (a value the user chose is kept) or an MPS control
// daemon runs (see mpsPipe), and returns the work queues the driver's
// contexts will get and whether the daemon's pipe is there. It must run
// before the driver is initialized; the driver then reads the process
// environment, which os.Setenv updates in a program built with cgo.
func askWorkQueues() (queues int, mps bool) {
	mps = mpsPipe() != ""
	v, set := os.LookupEnv(EnvMaxConnections)
	if !set && !mps && os.Setenv(EnvMaxConnections, strconv.Itoa(MaxWorkQueues)) == nil {
		v, set = strconv.Itoa(MaxWorkQueues), true
	}
	return workQueuesFrom(v, set), mps
}

// Under MPS the processes using a GPU are clients of one MPS server, and
// their contexts' work queues come out of the server's one pool: on an
// H100 (driver 580) three processes of 32 queues each attached and a
// fourth failed to create its context (CUDA_ERROR_OUT_OF_MEMORY or
// CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED), while eight of 8 queues
// attached (docs/reliability.md, case 36). So askWorkQueues leaves CUDA's
// default where an MPS control daemon runs.

// EnvMPSPipeDirectory is where MPS clients look for the control daemon's
// named pipes and sockets (default DefaultMPSPipeDirectory).
const EnvMPSPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"

// DefaultMPSPipeDirectory is MPS's pipe directory when
// CUDA_MPS_PIPE_DIRECTORY is unset.
const DefaultMPSPipeDirectory = "/tmp/nvidia-mps"

// mpsPipe returns the MPS control daemon's pipe, "control" in the pipe
// directory, when it is there as a named pipe or a socket (the daemon
// runs, or ran and left it: CUDA then runs without MPS, and contexts keep
// CUDA's default queues all the same), else "".
func mpsPipe() string {
	dir := os.Getenv(EnvMPSPipeDirectory)
	if dir == "" {
		dir = DefaultMPSPipeDirectory
	}
	p := filepath.Join(dir, "control")
	fi, err := os.Stat(p)
	if err != nil || fi.Mode()&(os.ModeNamedPipe|os.ModeSocket) == 0 {
		return ""
	}
	return p
}
