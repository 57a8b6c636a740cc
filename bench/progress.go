package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// Progress is a one-line progress bar redrawn with carriage returns. It is
// silent unless enabled (see NewProgress), so callers may always use it.
type Progress struct {
	mu      sync.Mutex
	w       io.Writer
	total   int
	done    int
	enabled bool
}

// IsTerminal reports whether w is a character device (a terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// NewProgress returns a bar of total steps on w, drawn only when w is a
// terminal or force is set (--progress).
func NewProgress(w io.Writer, total int, force bool) *Progress {
	return &Progress{w: w, total: total, enabled: force || IsTerminal(w)}
}

// Step counts one finished step and redraws the bar with label.
func (p *Progress) Step(label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	p.draw(label)
}

// Set sets the finished count (for progress read from elsewhere).
func (p *Progress) Set(done int, label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if done == p.done {
		return
	}
	p.done = done
	p.draw(label)
}

func (p *Progress) draw(label string) {
	if !p.enabled || p.total <= 0 {
		return
	}
	const width = 30
	n := min(p.done*width/p.total, width)
	if len(label) > 40 {
		label = label[:40]
	}
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d %-40s", strings.Repeat("#", n), strings.Repeat(".", width-n), p.done, p.total, label)
}

// Finish ends the bar's line.
func (p *Progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.enabled && p.total > 0 {
		fmt.Fprintln(p.w)
	}
}
