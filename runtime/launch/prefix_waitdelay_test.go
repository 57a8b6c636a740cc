package launch

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLineOfExactlyMaxLine: a line of exactly maxLine bytes whose
// newline arrives in a later Write (as a pipe's 32 KiB reads deliver a
// 64 KiB line) is one line, not that line and an empty one.
func TestLineOfExactlyMaxLine(t *testing.T) {
	var out bytes.Buffer
	p := &prefixWriter{mu: &sync.Mutex{}, w: &out, prefix: "[rank 0] "}
	line := bytes.Repeat([]byte("a"), maxLine)
	p.Write(line[:maxLine/2])
	p.Write(line[maxLine/2:])
	p.Write([]byte("\nnext\n"))
	p.flush()
	want := "[rank 0] " + string(line) + "\n[rank 0] next\n"
	if got := out.String(); got != want {
		t.Fatalf("got %d lines (%q...), want 2: a spurious empty line after a %d-byte line",
			strings.Count(got, "\n"), got[len(got)-min(len(got), 30):], maxLine)
	}
	// A line of two pieces with its newline in a Write of its own.
	out.Reset()
	p.Write(bytes.Repeat([]byte("b"), 2*maxLine))
	p.Write([]byte("\n"))
	p.flush()
	if n := strings.Count(out.String(), "\n"); n != 2 {
		t.Fatalf("a %d-byte line came out as %d pieces, want 2", 2*maxLine, n)
	}
	// An empty line that follows a complete line is still written.
	out.Reset()
	p.Write([]byte("x\n"))
	p.Write([]byte("\n"))
	if want := "[rank 0] x\n[rank 0] \n"; out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
}

// TestBackgroundChildHoldingOutput: a rank that exits 0 leaving a
// background child holding its stdout (a shell script's `daemon &`)
// succeeded; the launcher gives up on the child's output after
// Grace+1s, as documented, and must not report the rank as failed
// ("rank 0 exited with status 1") or stop its peers.
func TestBackgroundChildHoldingOutput(t *testing.T) {
	cfg, out, errb := config(2, "sleep")
	cfg.Args = []string{"sh", "-c", `if [ "$COLLGEN_RANK" = 0 ]; then sleep 30 & fi; echo done`}
	cfg.Grace = 100 * time.Millisecond
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("Wait = %v, want nil (every rank exited 0)\nstderr: %s", err, errb)
	}
	if n := strings.Count(out.String(), "done"); n != 2 {
		t.Fatalf("stdout %q: want both ranks' lines", out)
	}
}

// TestSplitThenShortTail: after a piece cut at maxLine, more bytes
// of the line and then its newline end the line as usual.
func TestSplitThenShortTail(t *testing.T) {
	var out bytes.Buffer
	p := &prefixWriter{mu: &sync.Mutex{}, w: &out, prefix: "> "}
	p.Write(bytes.Repeat([]byte("a"), maxLine))
	p.Write([]byte("tail"))
	p.Write([]byte("\n\n"))
	want := "> " + strings.Repeat("a", maxLine) + "\n> tail\n> \n"
	if out.String() != want {
		t.Fatalf("got ...%q, want ...%q", out.String()[maxLine:], want[maxLine:])
	}
}
