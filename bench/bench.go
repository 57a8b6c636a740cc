// Package bench holds what every collgen benchmark reports: a Result per
// (backend, collective, algorithm, dtype, op, world, size), rendered as an
// aligned table, JSON, CSV or a PNG plot (latency and bus bandwidth against
// size, drawn with the standard library only), plus a progress bar for
// terminals. The host and GPU benches share it so their outputs compare
// line for line.
package bench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/collgen/collgen/coll"
)

// Result is one measured configuration.
type Result struct {
	Backend    string  `json:"backend"`            // host, gpu, gloo, nccl, ...
	Collective string  `json:"collective"`         // allreduce, reduce_scatter, allgather
	Algorithm  string  `json:"algorithm"`          // oneshot, twoshot, ..., or "auto": the automatic selection's row, never a forced algorithm's
	Picked     string  `json:"picked,omitempty"`   // for an "auto" row, the algorithm the selection chose (results of older host benches name it in Algorithm instead)
	DType      string  `json:"dtype"`              // element type: f32, bf16, ...
	Op         string  `json:"op,omitempty"`       // empty for all-gather
	World      int     `json:"world"`              // ranks in the group
	Bytes      int64   `json:"bytes"`              // message size: the larger of input and output, NCCL-tests style
	Awkward    bool    `json:"awkward,omitempty"`  // an awkward twin (collgen bench --awkward), which may have a regular size's bytes
	Iters      int     `json:"iters"`              // timed iterations
	MedianUS   float64 `json:"median_us"`          // median over iterations: host, of the slowest rank's time; gpu, of rank 0's replay time per op (gpubench)
	BusGBps    float64 `json:"bus_gbps"`           // bus bandwidth, see BusBandwidth
	Baseline   string  `json:"baseline,omitempty"` // what Ratio compares with: a backend ("gloo"), with the algorithm of its row where that is not this row's ("gloo ring")
	Ratio      float64 `json:"ratio,omitempty"`    // baseline time / this time: >1 means faster than the baseline
	// LateWaits (host backend only) counts barrier waits that found a
	// peer late, per timed call, the most of any rank.
	LateWaits *LateWaits `json:"late_waits,omitempty"`
}

// LateWaits is host.WaitStats per call: late waits by the phase in which
// the peer came (busy-polling, yielding, blocked).
type LateWaits struct {
	Spun    float64 `json:"spun"`    // the peer came while the wait busy-polled
	Yielded float64 `json:"yielded"` // the peer came while the wait yielded the processor
	Blocked float64 `json:"blocked"` // the peer came after the wait had blocked (slept)
}

// BusBandwidth returns the bus bandwidth in GB/s (1e9 bytes per second) of
// a collective moving bytes in us microseconds over world ranks, with NCCL's
// convention: algorithm bandwidth bytes/time, scaled by 2(W-1)/W for
// all-reduce and (W-1)/W for reduce-scatter and all-gather, so that the
// figure compares with the hardware's link bandwidth whatever the world.
func BusBandwidth(collective coll.Collective, bytes int64, world int, us float64) float64 {
	if us <= 0 || world < 1 {
		return 0
	}
	alg := float64(bytes) / (us * 1e-6) / 1e9
	f := float64(world-1) / float64(world)
	if collective == coll.AllReduce {
		f *= 2
	}
	return alg * f
}

// Median returns the median of xs (the mean of the middle two for an even
// count); 0 for none. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// FormatBytes renders a size compactly with binary units: 4KiB, 1.5MiB.
func FormatBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10) + units[i]
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + units[i]
}

func formatRatio(r Result) string {
	if r.Ratio <= 0 {
		return ""
	}
	return fmt.Sprintf("%.2fx %s", r.Ratio, r.Baseline)
}

// algorithmCell is the table's algorithm column: the algorithm, and for
// an auto row what the selection chose ("auto:oneshot").
func algorithmCell(r Result) string {
	if r.Picked != "" {
		return r.Algorithm + ":" + r.Picked
	}
	return r.Algorithm
}

// WriteTable writes results as an aligned text table: latency in
// microseconds, bus bandwidth in GB/s and, where a baseline was measured,
// the speed-up over it. An auto row's algorithm reads "auto:PICKED".
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\tcollective\talgorithm\tdtype\top\tworld\tsize\titers\ttime(us)\tbusbw(GB/s)\tvs baseline\t")
	for _, r := range results {
		op := r.Op
		if op == "" {
			op = "-"
		}
		size := FormatBytes(r.Bytes)
		if r.Awkward {
			size += "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%.2f\t%.2f\t%s\t\n", r.Backend, r.Collective, algorithmCell(r), r.DType, op,
			r.World, size, r.Iters, r.MedianUS, r.BusGBps, formatRatio(r))
	}
	return tw.Flush()
}

// WriteJSON writes results as an indented JSON array.
func WriteJSON(w io.Writer, results []Result) error {
	if results == nil {
		results = []Result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(results)
}

// ReadJSON parses what WriteJSON wrote.
func ReadJSON(r io.Reader) ([]Result, error) {
	var out []Result
	if err := json.NewDecoder(r).Decode(&out); err != nil {
		return nil, fmt.Errorf("bench: read results: %w", err)
	}
	return out, nil
}

// csvHeader is WriteCSV's first row.
var csvHeader = []string{"backend", "collective", "algorithm", "dtype", "op", "world", "bytes", "iters", "median_us", "bus_gbps", "baseline", "ratio", "awkward", "picked"}

// awkwardCell is the CSV awkward column: "1" for an awkward twin, else
// empty.
func awkwardCell(awkward bool) string {
	if awkward {
		return "1"
	}
	return ""
}

// WriteCSV writes results as CSV with a header row.
func WriteCSV(w io.Writer, results []Result) error {
	cw := csv.NewWriter(w)
	cw.Write(csvHeader)
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }
	for _, r := range results {
		cw.Write([]string{r.Backend, r.Collective, r.Algorithm, r.DType, r.Op, strconv.Itoa(r.World),
			strconv.FormatInt(r.Bytes, 10), strconv.Itoa(r.Iters), f(r.MedianUS), f(r.BusGBps), r.Baseline, f(r.Ratio), awkwardCell(r.Awkward), r.Picked})
	}
	cw.Flush()
	return cw.Error()
}

// seriesKey names the line a result belongs to in a plot. Awkward twins
// (collgen bench --awkward) get lines of their own: in their regular
// sizes' lines they would zigzag between a size and its twin.
func seriesKey(r Result) string {
	parts := []string{r.Backend, r.Collective, r.Algorithm, r.DType}
	if r.Op != "" {
		parts = append(parts, r.Op)
	}
	parts = append(parts, "W"+strconv.Itoa(r.World))
	if r.Awkward {
		parts = append(parts, "awkward")
	}
	return strings.Join(parts, " ")
}
