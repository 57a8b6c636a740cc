package rendezvous

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// byteBudget is a counting semaphore over bytes: the TCP server's bound on
// large frames held in memory at once.
type byteBudget struct {
	mu     sync.Mutex
	used   int64
	max    int64
	peak   int64         // highest used seen (tests)
	freed  chan struct{} // closed and replaced on every release
	closed bool
}

func newByteBudget(max int64) *byteBudget {
	return &byteBudget{max: max, freed: make(chan struct{})}
}

// acquire takes n bytes, waiting for room until ctx ends. A request larger
// than the whole budget is admitted alone, when nothing else is held.
func (b *byteBudget) acquire(ctx context.Context, n int64) error {
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return ErrClosed
		}
		if b.used == 0 || b.used+n <= b.max {
			b.used += n
			b.peak = max(b.peak, b.used)
			b.mu.Unlock()
			return nil
		}
		ch := b.freed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release returns n bytes (0 is a no-op).
func (b *byteBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// close fails current and future waits.
func (b *byteBudget) close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.freed)
		b.freed = make(chan struct{})
	}
	b.mu.Unlock()
}

// usage returns the bytes held now and the peak so far.
func (b *byteBudget) usage() (used, peak int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.peak
}

// rateLogger passes lines to logf at most burst at once and then one per
// every; lines beyond are counted, and the next line that passes says how
// many were suppressed.
type rateLogger struct {
	logf       func(format string, args ...any)
	burst      int
	every      time.Duration
	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed int
}

func (l *rateLogger) printf(format string, args ...any) {
	if l.logf == nil {
		return
	}
	l.mu.Lock()
	now := time.Now()
	if l.last.IsZero() {
		l.tokens = float64(l.burst)
	} else {
		l.tokens = min(float64(l.burst), l.tokens+float64(now.Sub(l.last))/float64(l.every))
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.tokens--
	n := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	if n > 0 {
		msg += fmt.Sprintf(" (%d similar lines suppressed)", n)
	}
	l.logf("%s", msg)
}
