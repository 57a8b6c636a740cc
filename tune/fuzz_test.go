package tune

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/collgen/collgen/bench"
)

// FuzzTuneCSV: any text read as a bench CSV gives samples or a CSVError
// naming a line, and the samples turn into crossover tables or an error,
// never a panic; every table's rules have strictly increasing bounds and
// a last, unbounded rule.
func FuzzTuneCSV(f *testing.F) {
	header := "backend,collective,algorithm,dtype,op,world,bytes,iters,median_us,bus_gbps,baseline,ratio,awkward\n"
	f.Add(header + "gpu,allreduce,oneshot,bf16,sum,2,1024,100,3.5,0,,,\ngpu,allreduce,nccl,bf16,sum,2,1024,100,6,0,,,\ngpu,allreduce,oneshot,bf16,sum,2,2048,100,4,0,,,\ngpu,allreduce,nccl,bf16,sum,2,2048,100,5,0,,,\n")
	f.Add(header + "gpu,allreduce,oneshot,bf16,sum,2,1024,100,NaN,0,,,\n")
	f.Add("collective,algorithm,world,bytes,median_us\nallgather,oneshot_ll,4,1,1e308\nallgather,nccl,4,1,+Inf\n")
	f.Add("\"unterminated\n")
	f.Fuzz(func(t *testing.T, text string) {
		samples, err := ReadCSV(strings.NewReader(text), "fuzz.csv")
		if err != nil {
			var ce *CSVError
			if !errors.As(err, &ce) || ce.Line < 1 {
				t.Fatalf("ReadCSV error %T %v: want a *CSVError with a line", err, err)
			}
			return
		}
		for _, s := range samples {
			if s.World < 1 || s.Bytes < 1 || !(s.MedianUS > 0) {
				t.Fatalf("sample %+v passed the checks", s)
			}
		}
		tables, err := Crossovers(samples, Options{})
		if err != nil {
			return
		}
		for _, tb := range tables {
			if len(tb.Rules) == 0 || tb.Rules[len(tb.Rules)-1].UpTo != 0 {
				t.Fatalf("%s world %d: rules %+v; want a last, unbounded rule", tb.Collective, tb.World, tb.Rules)
			}
			for i := 1; i < len(tb.Rules)-1; i++ {
				if tb.Rules[i].UpTo <= tb.Rules[i-1].UpTo {
					t.Fatalf("%s world %d: bounds not increasing: %+v", tb.Collective, tb.World, tb.Rules)
				}
			}
		}
	})
}

// FuzzTuneJSON: any text read as bench JSON (bench.ReadJSON) gives results
// or an error, and FromResults turns results into samples that pass
// ReadCSV's checks, or an error; never a panic.
func FuzzTuneJSON(f *testing.F) {
	f.Add(`[{"backend":"gpu","collective":"allreduce","algorithm":"oneshot","world":2,"bytes":1024,"median_us":3.5}]`)
	f.Add(`[{"collective":"allgather","algorithm":"nccl","world":0,"bytes":-1,"median_us":-2}]`)
	f.Add(`[{"collective":"","algorithm":"x","world":2,"bytes":1,"median_us":1e309}]`)
	f.Add(`{}`)
	f.Fuzz(func(t *testing.T, text string) {
		rs, err := bench.ReadJSON(strings.NewReader(text))
		if err != nil {
			return
		}
		samples, err := FromResults(rs, "fuzz.json")
		if err != nil {
			return
		}
		for _, s := range samples {
			if s.World < 1 || s.Bytes < 1 || !(s.MedianUS > 0) || math.IsInf(s.MedianUS, 0) || s.Collective == "" || s.Algorithm == "" {
				t.Fatalf("sample %+v passed FromResults", s)
			}
		}
		Crossovers(samples, Options{})
	})
}
