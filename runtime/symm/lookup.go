//go:build linux && (amd64 || arm64)

package symm

import (
	"sync"
	"sync/atomic"
)

// span is one live allocation's user bytes, [start, end).
type span struct {
	start, end uintptr
	buf        *Buffer
}

// registry holds every live Buffer of the process, of every pool, for
// Lookup. Readers load spans and binary-search it: no lock, no allocation.
// Writers (Alloc, Free) serialise on mu and publish a new sorted slice;
// a published slice is never modified, so a reader holding an old one sees
// a consistent, if slightly stale, set.
var registry struct {
	mu    sync.Mutex
	spans atomic.Pointer[[]span]
}

// register adds b's span. Spans never overlap: each is inside its own
// address reservation.
func register(b *Buffer) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	var old []span
	if p := registry.spans.Load(); p != nil {
		old = *p
	}
	s := span{start: b.addr, end: b.addr + uintptr(b.size), buf: b}
	i := search(old, s.start)
	next := make([]span, 0, len(old)+1)
	next = append(next, old[:i]...)
	next = append(next, s)
	next = append(next, old[i:]...)
	registry.spans.Store(&next)
}

// unregister removes b's span, if present.
func unregister(b *Buffer) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	p := registry.spans.Load()
	if p == nil {
		return
	}
	old := *p
	i := search(old, b.addr)
	if i == len(old) || old[i].buf != b {
		return
	}
	next := make([]span, 0, len(old)-1)
	next = append(next, old[:i]...)
	next = append(next, old[i+1:]...)
	registry.spans.Store(&next)
}

// search returns the index of the first span starting at or after addr.
func search(s []span, addr uintptr) int {
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s[m].start < addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// Lookup reports whether ptr points into the user bytes of a live
// allocation of any Pool of this process, and if so which one and at what
// offset. It takes O(log n) in the number of live allocations, takes no
// lock and allocates nothing, so it can sit on every collective call's
// path (to take a zero-copy route when the input is already symmetric).
// A buffer freed concurrently may still be returned: its Rendezvous and
// its Handle's signal operations then report ErrFreed, and Bytes is nil,
// while Addr, Size and Handle still answer (a Handle's addresses are no
// longer mapped after Free). Freeing a buffer while a call reads it is the
// caller's race.
func Lookup(ptr uintptr) (buf *Buffer, offset int, ok bool) {
	p := registry.spans.Load()
	if p == nil {
		return nil, 0, false
	}
	s := *p
	// The span holding ptr is the last one starting at or before it.
	i := search(s, ptr)
	if i == len(s) || s[i].start != ptr {
		i--
	}
	if i < 0 || ptr >= s[i].end {
		return nil, 0, false
	}
	return s[i].buf, int(ptr - s[i].start), true
}
