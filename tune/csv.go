package tune

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/collgen/collgen/bench"
)

// Sample is one measured latency: a row of `collgen bench --csv` (the
// columns of bench.WriteCSV).
type Sample struct {
	// Backend is the bench backend: "gpu" or "host" (a baseline such as
	// "gloo" is a backend of its own).
	Backend string
	// Collective is allreduce, reduce_scatter or allgather.
	Collective string
	// Algorithm is a generated algorithm, "nccl", or "auto" (what the
	// current rules picked; Crossovers ignores it).
	Algorithm string
	// DType and Op are the element type and reduce op ("" for all-gather).
	DType, Op string
	// World is the number of ranks.
	World int
	// Bytes is the message size.
	Bytes int64
	// MedianUS is the median latency in microseconds.
	MedianUS float64
	// Pos is "file:line", for messages.
	Pos string
}

// CSVError is a malformed bench CSV.
type CSVError struct {
	// File and Line locate the problem (Line 1 is the header).
	File string
	Line int
	// Msg says what is wrong.
	Msg string
}

// Error gives "file:line: msg".
func (e *CSVError) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }

// required are the columns ReadCSV needs; backend, dtype and op are
// optional.
var required = []string{"collective", "algorithm", "world", "bytes", "median_us"}

// ReadCSV reads the rows of a bench CSV (as `collgen bench --csv` writes
// it; columns are found by their header names, so order and extra columns
// do not matter). name is the file name for errors.
func ReadCSV(r io.Reader, name string) ([]Sample, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, &CSVError{File: name, Line: 1, Msg: "empty file; want a bench CSV with a header row"}
	}
	if err != nil {
		return nil, &CSVError{File: name, Line: 1, Msg: err.Error()}
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.TrimSpace(h)] = i
	}
	for _, h := range required {
		if _, ok := col[h]; !ok {
			return nil, &CSVError{File: name, Line: 1, Msg: fmt.Sprintf("no %q column; want the header of collgen bench --csv (%s, ...)", h, strings.Join(required, ", "))}
		}
	}
	get := func(rec []string, h string) string {
		if i, ok := col[h]; ok && i < len(rec) {
			return strings.TrimSpace(rec[i])
		}
		return ""
	}
	var out []Sample
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			// FieldPos panics after a failed Read: the line is the
			// ParseError's.
			line := 0
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				line = pe.Line
			}
			return nil, &CSVError{File: name, Line: max(line, 1), Msg: err.Error()}
		}
		line, _ := cr.FieldPos(0)
		bad := func(format string, args ...any) error {
			return &CSVError{File: name, Line: line, Msg: fmt.Sprintf(format, args...)}
		}
		if a := get(rec, "awkward"); a == "1" || a == "true" {
			continue // an awkward twin (collgen bench --awkward): not a size the rules choose by
		}
		s := Sample{Backend: get(rec, "backend"), Collective: get(rec, "collective"), Algorithm: get(rec, "algorithm"),
			DType: get(rec, "dtype"), Op: get(rec, "op"), Pos: fmt.Sprintf("%s:%d", name, line)}
		if s.Collective == "" || s.Algorithm == "" {
			return nil, bad("empty collective or algorithm")
		}
		if s.World, err = strconv.Atoi(get(rec, "world")); err != nil || s.World < 1 {
			return nil, bad("world %q is not a positive integer", get(rec, "world"))
		}
		if s.Bytes, err = strconv.ParseInt(get(rec, "bytes"), 10, 64); err != nil || s.Bytes < 1 {
			return nil, bad("bytes %q is not a positive integer", get(rec, "bytes"))
		}
		if s.MedianUS, err = strconv.ParseFloat(get(rec, "median_us"), 64); err != nil || !(s.MedianUS > 0) || math.IsInf(s.MedianUS, 0) {
			return nil, bad("median_us %q is not a positive number", get(rec, "median_us"))
		}
		out = append(out, s)
	}
}

// FromResults converts bench results (as `collgen bench --json` writes
// them, read back with bench.ReadJSON) into samples, leaving out awkward
// twins (ReadCSV too); name is the file name for messages. Results without a positive latency, size or world are an
// error.
func FromResults(rs []bench.Result, name string) ([]Sample, error) {
	out := make([]Sample, 0, len(rs))
	for i, r := range rs {
		pos := fmt.Sprintf("%s: result %d", name, i)
		if r.Awkward {
			continue // an awkward twin: not a size the rules choose by
		}
		if r.Collective == "" || r.Algorithm == "" || r.World < 1 || r.Bytes < 1 || !(r.MedianUS > 0) || math.IsInf(r.MedianUS, 0) {
			return nil, fmt.Errorf("%s: want collective, algorithm, world, bytes and median_us, got %+v", pos, r)
		}
		out = append(out, Sample{Backend: r.Backend, Collective: r.Collective, Algorithm: r.Algorithm, DType: r.DType,
			Op: r.Op, World: r.World, Bytes: r.Bytes, MedianUS: r.MedianUS, Pos: pos})
	}
	return out, nil
}
