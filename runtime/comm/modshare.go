package comm

import (
	"context"
	"sync"
)

// moduleShare holds the kernel modules this process's communicators have
// loaded, one per GPU and identity, counted by the communicators holding
// them. A second communicator on a GPU (another group on it, or another
// rank of a group sharing it) takes the loaded module instead of loading
// it again: a load waits for every kernel of the CUDA context
// (tests/gpu/free_probe.cu), so where goroutine ranks share a GPU, a
// communicator made while another's kernel waits for a rank of this
// process would wait for that kernel (reliability case 39); and each load
// costs time and device memory. The last holder's drop hands the module
// back for unloading, which waits the same way (release parks it where
// ranks share the context: parkedGate). M is *cuda.Module on GPUs, a fake
// in tests.
type moduleShare[M any] struct {
	mu sync.Mutex
	m  map[moduleKey]*sharedModule[M]
}

// moduleKey names a module: the GPU, and what the module is built from
// (moduleID).
type moduleKey struct {
	ordinal int
	id      string
}

// sharedModule is one module and its holders. ready is closed once the
// loader has filled mod or err; refs counts the holders, the loader and
// its waiters included.
type sharedModule[M any] struct {
	ready chan struct{}
	mod   M
	err   error
	refs  int
}

// newModuleShare returns an empty share.
func newModuleShare[M any]() *moduleShare[M] {
	return &moduleShare[M]{m: map[moduleKey]*sharedModule[M]{}}
}

// claim takes a reference to key's module. With mine the caller loads it
// and must call fill; otherwise it calls wait. Either way it drops the
// reference when done with the module, except where fill failed or wait
// returned the loader's error (the entry is gone then).
func (s *moduleShare[M]) claim(key moduleKey) (e *sharedModule[M], mine bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e = s.m[key]; e != nil {
		e.refs++
		return e, false
	}
	e = &sharedModule[M]{ready: make(chan struct{}), refs: 1}
	s.m[key] = e
	return e, true
}

// fill records the loader's result. A failed load removes the entry, so
// that the next claim loads again, and its waiters get err.
func (s *moduleShare[M]) fill(key moduleKey, e *sharedModule[M], mod M, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.mod, e.err = mod, err
	if err != nil && s.m[key] == e {
		delete(s.m, key)
	}
	close(e.ready)
}

// wait returns the module once its loader has filled it. On ctx's end it
// drops the caller's reference itself and returns ctx's error. A filled
// entry wins over an ended ctx (both may be ready at once), and the
// reference given back is e's: after a failed load the key may already
// name another claimant's entry, whose reference is not this caller's.
func (s *moduleShare[M]) wait(ctx context.Context, key moduleKey, e *sharedModule[M]) (M, error) {
	select {
	case <-e.ready:
		return e.mod, e.err
	case <-ctx.Done():
	}
	select {
	case <-e.ready:
		return e.mod, e.err
	default:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[key] == e { // else the load failed and the entry is gone
		e.refs-- // never the last: the loader, not done, holds one
	}
	var zero M
	return zero, ctx.Err()
}

// drop releases one reference to key's module and reports whether it was
// the last: the caller then unloads mod.
func (s *moduleShare[M]) drop(key moduleKey) (mod M, last bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	if e == nil {
		return mod, false
	}
	if e.refs--; e.refs > 0 {
		return mod, false
	}
	delete(s.m, key)
	return e.mod, true
}
