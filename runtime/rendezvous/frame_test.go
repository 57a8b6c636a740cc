package rendezvous

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzDecodeFrame feeds arbitrary payloads to the frame decoder: it must
// never panic or over-allocate, and whatever it accepts must re-encode to
// the same bytes. `go test` runs the seeds; `go test -fuzz FuzzDecodeFrame
// ./runtime/rendezvous` explores further.
func FuzzDecodeFrame(f *testing.F) {
	seeds := []*frame{
		{Op: opSet, ID: 1, Seq: 2, Args: [][]byte{[]byte("key"), []byte("value")}},
		{Op: opWait, Num: 1500, Args: [][]byte{[]byte("a"), []byte("b"), {}}},
		{Op: opCAS, Flags: flagOldAbsent, Args: [][]byte{[]byte("k"), nil, []byte("new")}},
		{Op: opAdd, Num: -7, Args: [][]byte{[]byte("ctr")}},
		{Op: statusTimeout},
	}
	for _, s := range seeds {
		f.Add(appendFrame(nil, s)[frameLenSize:])
	}
	f.Add([]byte{})
	f.Add(make([]byte, payloadHeader))
	f.Add(append(make([]byte, payloadHeader-4), 0xff, 0xff, 0xff, 0xff))
	f.Add(append(make([]byte, payloadHeader-4), 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff))
	f.Fuzz(func(t *testing.T, p []byte) {
		fr, err := decodeFrame(p)
		if err != nil {
			return
		}
		out := appendFrame(nil, fr)[frameLenSize:]
		if !bytes.Equal(out, p) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", p, out)
		}
		// And through the length-prefixed reader.
		fr2, err := readFrame(bytes.NewReader(appendFrame(nil, fr)), len(p))
		if err != nil || !reflect.DeepEqual(normalize(fr), normalize(fr2)) {
			t.Fatalf("readFrame round trip: %v", err)
		}
	})
}

// normalize maps empty args to nil so DeepEqual compares content.
func normalize(f *frame) *frame {
	g := *f
	g.Args = nil
	for _, a := range f.Args {
		if len(a) == 0 {
			a = nil
		}
		g.Args = append(g.Args, a)
	}
	return &g
}

func TestReadFrameLimit(t *testing.T) {
	b := appendFrame(nil, &frame{Op: opSet, Args: [][]byte{make([]byte, 100)}})
	if _, err := readFrame(bytes.NewReader(b), 50); err == nil {
		t.Fatal("readFrame accepted a frame over the limit")
	}
	if _, err := readFrame(bytes.NewReader(b[:20]), 1000); err == nil {
		t.Fatal("readFrame accepted a truncated frame")
	}
}
