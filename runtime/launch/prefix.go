package launch

import (
	"bytes"
	"io"
	"sync"
)

// maxLine bounds a buffered partial line; a longer line is written out in
// pieces, each with its own prefix.
const maxLine = 64 << 10

// prefixWriter writes each complete line of a rank's output as
// prefix+line+"\n" to w, holding mu for the whole line so that lines of
// different ranks never interleave. A partial line waits for its newline (or
// flush).
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
	// split: the last piece written was cut at maxLine, so a newline
	// that comes next ends that line (already written) rather than
	// making an empty one.
	split bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i == 0 && p.split && len(p.buf) == 0 {
			p.split = false
			b = b[1:]
			continue
		}
		if i < 0 || len(p.buf)+i > maxLine {
			take := min(len(b), maxLine-len(p.buf))
			p.buf = append(p.buf, b[:take]...)
			b = b[take:]
			if len(p.buf) >= maxLine {
				p.writeLine()
				p.split = true
			}
			continue
		}
		p.buf = append(p.buf, b[:i]...)
		p.writeLine()
		b = b[i+1:]
	}
	return n, nil
}

// flush writes out a pending partial line, newline added; called once the
// rank has exited.
func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		p.writeLine()
	}
}

// writeLine writes the buffered line with prefix and newline. Write errors
// are dropped: a closed terminal must not kill the ranks.
func (p *prefixWriter) writeLine() {
	p.mu.Lock()
	defer p.mu.Unlock()
	line := make([]byte, 0, len(p.prefix)+len(p.buf)+1)
	line = append(append(append(line, p.prefix...), p.buf...), '\n')
	p.w.Write(line)
	p.buf = p.buf[:0]
	p.split = false
}
