package cuda

import (
	"os"
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
// the process set it (a value the user chose is kept), and returns the
// work queues the driver's contexts will get. It must run before the
// driver is initialized; the driver then reads the process environment,
// which os.Setenv updates in a program built with cgo.
func askWorkQueues() int {
	v, set := os.LookupEnv(EnvMaxConnections)
	if !set && os.Setenv(EnvMaxConnections, strconv.Itoa(MaxWorkQueues)) == nil {
		v, set = strconv.Itoa(MaxWorkQueues), true
	}
	return workQueuesFrom(v, set)
}
