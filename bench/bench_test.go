package bench

import (
	"bytes"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
)

func sample() []Result {
	var rs []Result
	for _, b := range []int64{4 << 10, 64 << 10, 1 << 20, 16 << 20} {
		us := 5 + float64(b)/4e3
		rs = append(rs, Result{Backend: "host", Collective: "allreduce", Algorithm: "twoshot", DType: "f32", Op: "sum", World: 4,
			Bytes: b, Iters: 100, MedianUS: us, BusGBps: BusBandwidth(coll.AllReduce, b, 4, us), Baseline: "gloo", Ratio: 3.5})
		rs = append(rs, Result{Backend: "host", Collective: "allgather", Algorithm: "oneshot", DType: "bf16", World: 4,
			Bytes: b, Iters: 100, MedianUS: us / 2, BusGBps: BusBandwidth(coll.AllGather, b, 4, us/2)})
	}
	return rs
}

func TestBusBandwidth(t *testing.T) {
	// 1 GB in 1 s on 4 ranks: algbw 1, all-reduce busbw 1.5, all-gather 0.75.
	if got := BusBandwidth(coll.AllReduce, 1e9, 4, 1e6); math.Abs(got-1.5) > 1e-12 {
		t.Errorf("allreduce: %v", got)
	}
	if got := BusBandwidth(coll.AllGather, 1e9, 4, 1e6); math.Abs(got-0.75) > 1e-12 {
		t.Errorf("allgather: %v", got)
	}
	if got := BusBandwidth(coll.AllReduce, 1e9, 1, 1e6); got != 0 {
		t.Errorf("world 1: %v", got)
	}
	if got := BusBandwidth(coll.ReduceScatter, 1e9, 8, 0.5e6); math.Abs(got-1.75) > 1e-12 {
		t.Errorf("reduce_scatter W=8 in 0.5 s: %v", got)
	}
	if got := BusBandwidth(coll.AllReduce, 1e9, 2, 0); got != 0 {
		t.Errorf("zero time: %v", got)
	}
	xs := []float64{3, 1, 2}
	if Median(xs) != 2 || xs[0] != 3 || Median([]float64{4, 1, 2, 3}) != 2.5 || Median(nil) != 0 {
		t.Error("Median")
	}
}

// TestAutoRowOutputs: an auto row says what it picked in the table
// ("auto:oneshot") and in the JSON and CSV ("picked"), apart from a forced
// row of that algorithm; tune reads the CSV by its header, so a file
// without the column still reads.
func TestAutoRowOutputs(t *testing.T) {
	rs := []Result{
		{Backend: "host", Collective: "allreduce", Algorithm: "auto", Picked: "oneshot", DType: "f32", Op: "sum", World: 2, Bytes: 4096, Iters: 5, MedianUS: 3},
		{Backend: "host", Collective: "allreduce", Algorithm: "oneshot", DType: "f32", Op: "sum", World: 2, Bytes: 4096, Iters: 5, MedianUS: 3},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, rs); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); strings.Count(out, " auto:oneshot ") != 1 || strings.Count(out, " oneshot ") != 1 {
		t.Errorf("table: want one auto:oneshot row and one oneshot row:\n%s", out)
	}
	b.Reset()
	WriteJSON(&b, rs)
	js := b.String()
	if back, err := ReadJSON(&b); err != nil || back[0] != rs[0] || back[1] != rs[1] {
		t.Errorf("JSON round trip: %v %+v", err, back)
	}
	if !strings.Contains(js, `"picked": "oneshot"`) || strings.Count(js, `"picked"`) != 1 {
		t.Errorf("JSON: want picked on the auto row only:\n%s", js)
	}
	b.Reset()
	WriteCSV(&b, rs)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if !strings.HasSuffix(lines[0], ",awkward,picked") || !strings.HasSuffix(lines[1], ",oneshot") || !strings.Contains(lines[1], ",auto,") || !strings.HasSuffix(lines[2], ",") {
		t.Errorf("csv:\n%s", b.String())
	}
}

func TestOutputs(t *testing.T) {
	rs := sample()
	var b bytes.Buffer
	if err := WriteTable(&b, rs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "3.50x gloo") || !strings.Contains(b.String(), "16MiB") || strings.Count(b.String(), "\n") != len(rs)+1 {
		t.Errorf("table:\n%s", b.String())
	}
	b.Reset()
	if err := WriteJSON(&b, rs); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(&b)
	if err != nil || len(back) != len(rs) || back[3] != rs[3] {
		t.Errorf("JSON round trip: %v %v", err, back)
	}
	b.Reset()
	if err := WriteCSV(&b, rs); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); len(lines) != len(rs)+1 || !strings.HasPrefix(lines[0], "backend,collective") {
		t.Errorf("csv:\n%s", b.String())
	}
	path := filepath.Join(t.TempDir(), "plot.png")
	if err := WritePNG(path, rs); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds().Dx() < 500 || img.Bounds().Dy() < 600 {
		t.Errorf("image %v", img.Bounds())
	}
	if err := WritePNG(path, nil); err == nil {
		t.Error("empty plot accepted")
	}
	twin := rs[0]
	twin.Awkward = true
	if seriesKey(twin) == seriesKey(rs[0]) {
		t.Errorf("an awkward twin plots in its regular size's line: %q", seriesKey(twin))
	}
}

func TestProgress(t *testing.T) {
	var b bytes.Buffer
	p := NewProgress(&b, 4, false)
	p.Step("x")
	if b.Len() != 0 {
		t.Errorf("drew on a non-terminal: %q", b.String())
	}
	p = NewProgress(&b, 4, true)
	p.Step("allreduce 4KiB")
	p.Step("allreduce 8KiB")
	p.Finish()
	if !strings.Contains(b.String(), "2/4 allreduce 8KiB") {
		t.Errorf("progress: %q", b.String())
	}
}
