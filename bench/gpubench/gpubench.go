// Package gpubench is the sweep behind `collgen bench --backend gpu`: for
// every message size and every variant of one collective (each generated
// algorithm forced, the automatic selection, and NCCL) it measures the
// per-operation latency on real GPUs, side by side in the same processes,
// and derives NCCL-convention bus bandwidth and the ratio to NCCL.
//
// # Method
//
// Ranks are goroutines of one process, one GPU each (Run), or processes
// that share a rendezvous store (RunRank). Every rank issues exactly the
// same sequence of operations, with a host barrier between measurements.
// For one (size, variant):
//
//  1. --check: the variant runs once; every rank copies its output back and
//     compares it with a float64 host reference (numeric.Check), regenerating
//     every rank's input from its seed.
//  2. Warm-up: Warmup collectives, launched eagerly (this also compiles the
//     kernel on first use).
//  3. Graph mode (default): OpsPerGraph (K=20) back-to-back collectives are
//     captured into one CUDA graph on each rank's own stream. The captured
//     ops alternate between two input buffers holding different random data
//     (never zeros), so consecutive ops do not re-read one L2-resident
//     buffer; both buffers are as large as the message, so at sizes below
//     the 50 MiB L2 both may still be cache resident, as they would be in an
//     application that reuses its buffers.
//  4. Calibration: one replay is timed; the number of timed replays R is
//     chosen so that they take about Target (20 ms), at least MinReplays,
//     at most MaxReplays (or exactly Replays when set).
//  5. Timing: after a host barrier every rank enqueues one untimed replay
//     (it lines the ranks up on the GPU: a collective cannot finish before
//     every rank has joined it) and then R replays back to back; rank 0
//     records a CUDA event between consecutive replays. Per-op latency of a
//     replay is its event time / K; the reported latency is the median over
//     the R replays.
//
// With Eager, step 3 is skipped and a "replay" is K collectives launched
// one by one from the host, so launch overhead is part of the figure.
package gpubench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/collgen/collgen/bench"
	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/spec"
)

// Defaults for Config fields left zero.
const (
	DefaultOpsPerGraph = 20
	DefaultWarmup      = 5
	DefaultMinReplays  = 5
	DefaultMaxReplays  = 1000
	DefaultTargetMS    = 20.0
	DefaultSizes       = "1KiB..256MiB"
)

// FormatSize renders a byte count the way tables show it (1KiB, 256MiB).
func FormatSize(n int64) string { return spec.FormatSize(n) }

// AlgBandwidthGBps is bytes / time in GB/s.
func AlgBandwidthGBps(bytes int64, seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	return float64(bytes) / seconds / 1e9
}

// Replays returns how many timed replays to run when one replay takes
// replayMs: enough for targetMs, clamped to [min, max].
func Replays(replayMs, targetMs float64, min, max int) int {
	if max < min {
		max = min
	}
	if replayMs <= 0 || math.IsNaN(replayMs) {
		return max
	}
	r := math.Ceil(targetMs / replayMs)
	if r < float64(min) {
		return min
	}
	if r > float64(max) {
		return max
	}
	return int(r)
}

// Shape is bench.Shape: what one message size means for a collective.
type Shape = bench.Shape

// ShapeFor is bench.ShapeFor: it maps a requested size to a collective's
// call shape, ok false when the size holds less than one element per rank.
func ShapeFor(collective coll.Collective, dtype coll.DType, bytes int64, world int) (sh Shape, ok bool) {
	return bench.ShapeFor(collective, dtype, bytes, world)
}

// Variant is one column of the comparison.
type Variant struct {
	// Algorithm is what comm.Options.Algorithm is given: a forced generated
	// algorithm, coll.NCCL, or coll.Auto for the automatic selection.
	Algorithm coll.Algorithm
	// Buffers says which buffers the collectives run on: the sweep's
	// plain ones, or (NCCL variants) ones registered with NCCL.
	Buffers Buffers
}

// Buffers is the kind of buffers a variant runs on.
type Buffers int

// Buffer kinds. Each has buffers of its own, so a registration never
// reaches another variant's runs.
const (
	// PlainBuffers: cuMemAlloc buffers, not registered.
	PlainBuffers Buffers = iota
	// RegisteredBuffers: cuMemAlloc buffers registered with NCCL
	// (Communicator.RegisterBuffer, ncclCommRegister): variant nccl_reg.
	RegisteredBuffers
	// WindowBuffers: ncclMemAlloc buffers registered as symmetric NCCL
	// windows (Communicator.RegisterWindow, NCCL 2.27+): variant nccl_win.
	WindowBuffers
)

// ncclVariants are the NCCL variants on registered buffers, by name; they
// run only when named (--algorithms ...,nccl_reg,nccl_win).
var ncclVariants = map[string]Buffers{"nccl_reg": RegisteredBuffers, "nccl_win": WindowBuffers}

// Name is what tables show: the algorithm's name, "auto", "nccl",
// "nccl_reg" or "nccl_win".
func (v Variant) Name() string {
	for n, b := range ncclVariants {
		if v.Buffers == b {
			return n
		}
	}
	return v.Algorithm.String()
}

// Custom reports whether the variant forces a generated kernel.
func (v Variant) Custom() bool { return v.Algorithm.Generated() }

// Algorithms lists, in library order, the generated algorithms of a
// collective for a dtype, op and world size.
func Algorithms(lib *kernels.Library, collective coll.Collective, dtype coll.DType, op coll.Op, world int) []coll.Algorithm {
	var out []coll.Algorithm
	seen := map[coll.Algorithm]bool{}
	if collective == coll.AllGather {
		op = ""
	}
	for _, k := range lib.Kernels {
		if k.Collective == collective && k.DType == dtype && k.Op == op && k.World == world && !seen[k.Algorithm] {
			seen[k.Algorithm] = true
			out = append(out, k.Algorithm)
		}
	}
	return out
}

// Variants builds the variant list: requested names in the given order, or
// (for none, or the single name "all") every generated algorithm of the
// collective, then Auto, then NCCL. The NCCL variants on registered
// buffers, nccl_reg and nccl_win, run when named. A name that is no
// algorithm at all is an error listing what exists; an algorithm this
// collective has no kernel for here (twoshot for an all-gather, anything
// at a world size without kernels) is left out and returned in missing,
// so one sweep over several collectives can name each one's algorithms,
// unless nothing requested is left, which is an error.
func Variants(lib *kernels.Library, collective coll.Collective, dtype coll.DType, op coll.Op, world int, requested []string) (vs []Variant, missing []string, err error) {
	algs := Algorithms(lib, collective, dtype, op, world)
	var names []string
	for _, r := range requested {
		for _, n := range strings.Split(r, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
	}
	all := append(slices.Clone(algs), coll.Auto, coll.NCCL)
	if len(names) == 0 || (len(names) == 1 && names[0] == "all") {
		names = names[:0]
		for _, a := range all {
			names = append(names, a.String())
		}
	}
	have := func() string {
		hs := make([]string, len(all))
		for i, a := range all {
			hs[i] = a.String()
		}
		return strings.Join(hs, ", ") + ", nccl_reg, nccl_win"
	}
	seen := map[Variant]bool{}
	for _, n := range names {
		v := Variant{Algorithm: coll.NCCL}
		if b, ok := ncclVariants[n]; ok {
			v.Buffers = b
		} else {
			a, err := coll.ParseAlgorithm(n)
			if err != nil {
				return nil, nil, fmt.Errorf("unknown algorithm %q for %s %s %s at world %d; have: %s", n, collective, dtype, opOrDash(collective, op), world, have())
			}
			if !slices.Contains(all, a) {
				if !slices.Contains(missing, n) {
					missing = append(missing, n)
				}
				continue
			}
			v.Algorithm = a
		}
		if !seen[v] {
			seen[v] = true
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return nil, missing, fmt.Errorf("no kernel for %s of %s %s %s at world %d; have: %s", strings.Join(missing, ", "), collective, dtype, opOrDash(collective, op), world, have())
	}
	return vs, missing, nil
}

func opOrDash(collective coll.Collective, op coll.Op) string {
	if !collective.Reduces() {
		return "(copy)"
	}
	return string(op)
}

// SkipReason says why a variant is not measured at a size, or "" when it
// runs: a forced generated algorithm that needs more stage-slot bytes
// (need, from kernels.Library.SlotBound) than the staging buffer
// (stagingBytes) cannot run (comm refuses it rather than substituting), and
// NCCL cannot run when it is unavailable (ncclErr).
func SkipReason(v Variant, bytes, need, stagingBytes int64, ncclErr error) string {
	switch {
	case v.Algorithm == coll.NCCL && ncclErr != nil:
		return v.Name() + " unavailable: " + ncclErr.Error()
	case v.Custom() && stagingBytes > 0 && need > stagingBytes:
		what := FormatSize(bytes)
		if need != bytes {
			what += fmt.Sprintf(" (needing %s of inbox)", FormatSize(need))
		}
		return fmt.Sprintf("%s above its %s staging buffer (raise --staging or the sweep's largest forced size)", what, FormatSize(stagingBytes))
	}
	return ""
}

// RefusalReason is why a variant is skipped when the communicator
// refuses it for this call (err from Communicator.Explain, the same on
// every rank), or "" to measure it: a refusal is the configuration's
// answer, not a failure of the run. A forced variant is skipped when
// refused (an algorithm without a kernel for the dtype, an inbox or
// scratch area too small for the size); auto only where NCCL is
// unavailable (ncclErr, agreed by every rank: no libnccl,
// Config.DisableNCCL, ranks sharing a GPU) and the rules give the size to
// NCCL (ErrUnsupported). Auto's other errors are failures.
func RefusalReason(v Variant, err, ncclErr error) string {
	switch {
	case err == nil:
		return ""
	case v.Algorithm == coll.Auto:
		if ncclErr == nil || !errors.Is(err, comm.ErrUnsupported) {
			return ""
		}
	case !errors.Is(err, comm.ErrInvalidArgument) && !errors.Is(err, comm.ErrUnsupported):
		return ""
	}
	return err.Error()
}

// StagingFor returns the staging size (comm.Config.StagingBytes) a sweep
// of a collective needs, or 0 for comm's default sizing, which holds what
// the rules send to generated kernels within the staging budget (kernels
// with rounds running more of them): a sweep of the automatic choice or of
// algorithms with rounds then measures what users get. A forced push
// algorithm without rounds needs its inbox for the sweep's largest size
// (sizes in any order); when that is more than the default gives its
// protocol (the rules' floor), the result is that need, at least what the
// rules need, and at most limit when limit > 0.
func StagingFor(lib *kernels.Library, collective coll.Collective, world int, sizes []int64, variants []Variant, limit int64) int64 {
	var rules int64
	floor := map[coll.Protocol]int64{}
	for i := range lib.Selections {
		sel := &lib.Selections[i]
		if sel.Kind == coll.HostSHM || !slices.Contains(sel.Worlds, world) {
			continue
		}
		for p, m := range lib.RulesSlotBounds(sel, world) {
			rules, floor[p] = max(rules, m.Need), max(floor[p], m.Floor)
		}
	}
	var s int64
	for _, v := range variants {
		if !v.Custom() || len(sizes) == 0 {
			continue
		}
		k, ok := lib.AlgorithmKernel(collective, v.Algorithm, world)
		if !ok || k.Rounds() {
			continue
		}
		// The largest size's need, whatever the order of sizes (the last
		// is an awkward twin, one element less per rank, or any size
		// Config.Sizes ends with).
		var need int64
		for _, b := range sizes {
			need = max(need, lib.SlotBound(collective, v.Algorithm, world, b))
		}
		if need > floor[k.Protocol] {
			s = max(s, need, rules)
		}
	}
	if limit > 0 && s > limit {
		s = limit
	}
	return s
}

// Measurement is one (size, variant) result of a sweep.
type Measurement struct {
	// Collective, DType, Op (empty for all-gather) and World (ranks) name
	// the sweep the measurement belongs to (Config's Collective, DType, Op
	// and WorldSize).
	Collective coll.Collective `json:"collective"`
	DType      coll.DType      `json:"dtype"`
	Op         coll.Op         `json:"op,omitempty"`
	World      int             `json:"world"`
	// Bytes is the full buffer size (see Shape.Bytes).
	Bytes int64 `json:"bytes"`
	// Offset is the bytes the input and output pointers lay past an aligned
	// allocation: one element for an awkward twin that moves them
	// (Config.Awkward), else 0.
	Offset int64 `json:"offset,omitempty"`
	// Awkward marks an awkward twin (bench.Shape.Awkward), which may have
	// the bytes of the regular size it follows.
	Awkward bool `json:"awkward,omitempty"`
	// Variant is the column: an algorithm, "auto" or "nccl".
	Variant string `json:"variant"`
	// Algorithm is what ran: the forced algorithm, or for "auto" the one
	// the selection picked.
	Algorithm coll.Algorithm `json:"algorithm,omitempty"`
	// ZeroCopy: the kernel read its input in place from symmetric memory.
	ZeroCopy bool `json:"zero_copy,omitempty"`
	// Mode is "graph" (CUDA-graph replay) or "eager".
	Mode string `json:"mode"`
	// LatencyUS is the median per-op latency in microseconds; MinUS and
	// MaxUS the fastest and slowest replay's per-op latency.
	LatencyUS float64 `json:"latency_us,omitempty"`
	MinUS     float64 `json:"min_us,omitempty"`
	MaxUS     float64 `json:"max_us,omitempty"`
	// BusGBps is NCCL-convention bus bandwidth; AlgGBps is bytes/time.
	BusGBps float64 `json:"bus_gbps,omitempty"`
	AlgGBps float64 `json:"alg_gbps,omitempty"`
	// VsNCCL is NCCL's latency / this latency (above 1: faster than NCCL);
	// 0 when NCCL was not measured at this size.
	VsNCCL float64 `json:"vs_nccl,omitempty"`
	// Replays is the number of timed replays, OpsPerReplay the collectives
	// in each.
	Replays      int `json:"replays,omitempty"`
	OpsPerReplay int `json:"ops_per_replay,omitempty"`
	// Skipped says why the variant was not measured ("" when it was).
	Skipped string `json:"skipped,omitempty"`
	// Error is a failure of this measurement (it was not timed).
	Error string `json:"error,omitempty"`
	// Check is "ok", "FAIL: ..." or "" when not checked.
	Check string `json:"check,omitempty"`
}

// Measured reports whether the measurement holds a latency.
func (m *Measurement) Measured() bool { return m.Skipped == "" && m.Error == "" && m.LatencyUS > 0 }

// CheckFailed reports whether --check found a wrong result.
func (m *Measurement) CheckFailed() bool { return strings.HasPrefix(m.Check, "FAIL") }

// Row is a sweep's table row: a size, and whether it is an awkward twin,
// which may have the regular size's bytes (bench.AwkwardOffset).
type Row struct {
	Bytes   int64 // the message size in bytes (Measurement.Bytes)
	Awkward bool  // the row of an awkward twin, not of the regular size with these bytes
}

// Row is the row m belongs to.
func (m *Measurement) Row() Row { return Row{m.Bytes, m.Awkward} }

// fillDerived sets bandwidths and, per size, the ratio to NCCL. A row
// whose --check failed neither is NCCL's reference nor gets a ratio: its
// time is not that of a kernel computing the collective (the bench leaves
// it out of its results).
func fillDerived(ms []Measurement) {
	ncclAt := map[Row]float64{}
	for i := range ms {
		m := &ms[i]
		if !m.Measured() {
			continue
		}
		sec := m.LatencyUS * 1e-6
		m.BusGBps = bench.BusBandwidth(m.Collective, m.Bytes, m.World, m.LatencyUS)
		m.AlgGBps = AlgBandwidthGBps(m.Bytes, sec)
		if m.Variant == coll.NCCL.String() && !m.CheckFailed() {
			ncclAt[m.Row()] = m.LatencyUS
		}
	}
	for i := range ms {
		m := &ms[i]
		if n, ok := ncclAt[m.Row()]; ok && m.Measured() && !m.CheckFailed() {
			m.VsNCCL = n / m.LatencyUS
		}
	}
}
