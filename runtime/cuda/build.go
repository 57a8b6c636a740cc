package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// Builder compiles many programs at once: in parallel, through a Cache
// that processes of one host share. Each program is compiled by one
// process only: a worker takes the program's lock file in the cache
// directory before compiling it; a program whose lock another process (or
// another Builder) holds is put aside and taken up again after the rest,
// by which time it is usually in the cache. A lock dies with its holder
// (flock), so a crashed process never blocks the others.
type Builder struct {
	// Cache holds compiled images; nil compiles every program and caches
	// nothing.
	Cache *Cache
	// Workers is how many programs compile at once; 0 means
	// runtime.NumCPU(). NVRTC compiles of all Builders of a process share
	// one limit of runtime.NumCPU().
	Workers int
	// Compile turns one request into an image; nil means NVRTC (Compile).
	Compile func(context.Context, CompileRequest) ([]byte, error)
	// Compiler names Compile's compiler and version in cache keys; "" means
	// the loaded NVRTC (see Cache.Key).
	Compiler string
	// Start is the index of the first program taken; ranks of one host
	// that start at different places seldom wait for each other. Any
	// value is taken modulo the number of programs (negative: 0).
	Start int
	// LockWait bounds how long a program waits for the cache lock another
	// process (or Builder) holds on it, after which it is compiled here
	// all the same (the holder's work is only repeated; entries are
	// written atomically). 0 means DefaultLockWait. A holder that is alive
	// but stopped (SIGSTOP, a debugger) keeps its flock, so without the
	// bound a caller with no deadline (Device.LoadSource, a lazy kernel
	// load, comm.New without one) would wait for it for ever.
	LockWait time.Duration
}

// DefaultLockWait is Builder.LockWait's default: far longer than NVRTC
// takes for one program (seconds), so a working holder is always waited
// for.
const DefaultLockWait = 2 * time.Minute

// Built is one program's image.
type Built struct {
	Image []byte // what Compile returns: a CUBIN, or PTX
	// Compiled is true when this Builder compiled the program, false when
	// it was read from the cache (possibly after another process built it).
	Compiled bool
}

// BuildError is a program of a Build that could not be compiled (or
// loaded, for Device.LoadSources). Index is its place in the request list.
type BuildError struct {
	Index int    // its place in the request list
	Name  string // its name
	Err   error  // the cause
}

// Error names the program and the cause.
func (e *BuildError) Error() string { return fmt.Sprintf("cuda: build %s: %v", e.Name, e.Err) }

// Unwrap returns the cause (a *CompileError for a compile failure).
func (e *BuildError) Unwrap() error { return e.Err }

// errLocked reports that another process holds a program's lock.
var errLocked = errors.New("cuda: cache entry locked by another process")

// Build returns an image for every request, in request order. The first
// failure stops the others (programs already compiling finish) and is
// returned as a *BuildError; the end of ctx is returned wrapped.
func (b *Builder) Build(ctx context.Context, reqs []CompileRequest) ([]Built, error) {
	out := make([]Built, len(reqs))
	order := make([]int, len(reqs))
	n := max(len(reqs), 1)
	start := max(b.Start, 0) % n // before adding: Start near MaxInt would wrap negative
	for i := range order {
		order[i] = (i + start) % n
	}
	var mu sync.Mutex
	var held []int // programs whose lock another process held
	err := b.forEach(ctx, order, func(ctx context.Context, i int) error {
		var err error
		out[i], err = b.one(ctx, reqs[i], false)
		if errors.Is(err, errLocked) {
			mu.Lock()
			held = append(held, i)
			mu.Unlock()
			return nil
		}
		return buildError(reqs, i, err)
	})
	if err == nil {
		err = b.forEach(ctx, held, func(ctx context.Context, i int) error {
			var err error
			out[i], err = b.one(ctx, reqs[i], true)
			return buildError(reqs, i, err)
		})
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// buildError wraps err (nil stays nil) as program i's *BuildError.
func buildError(reqs []CompileRequest, i int, err error) error {
	if err == nil {
		return nil
	}
	return &BuildError{Index: i, Name: reqs[i].Name, Err: err}
}

// forEach runs fn over idx on the Builder's workers; the first error
// cancels the context the others see, stops handing out work, and is
// returned; so is the end of ctx.
func (b *Builder) forEach(ctx context.Context, idx []int, fn func(context.Context, int) error) error {
	if len(idx) == 0 {
		return nil
	}
	workers := b.Workers
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan int)
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range min(workers, len(idx)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
feed:
	for _, i := range idx {
		select {
		case work <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if first != nil {
		return first
	}
	if err := parent.Err(); err != nil { // ended while feeding, before any fn failed
		return fmt.Errorf("cuda: build: %w", err)
	}
	return nil
}

// one builds one program. Unless wait is set, a lock held elsewhere
// returns errLocked at once. A cache that cannot be locked or written (a
// read-only directory) only costs the sharing: the program is compiled
// here.
func (b *Builder) one(ctx context.Context, req CompileRequest, wait bool) (Built, error) {
	key, keyed := b.key(req)
	if keyed {
		// One program counts once in the cache's stats, however often
		// it is looked up: a hit, or (when it is compiled here) a miss,
		// or corrupt if either look found a bad entry.
		img, miss := b.Cache.lookup(key)
		if miss == nil {
			b.Cache.count(nil)
			return Built{Image: img}, nil
		}
		lctx := ctx
		if wait {
			var cancel context.CancelFunc
			lctx, cancel = context.WithTimeout(ctx, b.lockWait())
			defer cancel()
		}
		unlock, err := b.Cache.lock(lctx, key, wait)
		switch {
		case errors.Is(err, errLocked):
			return Built{}, err // counted when this program is built after all
		case err == nil:
			// Checked before ctx: a lock taken as ctx ends is still ours
			// to give back (compile below then returns ctx's error).
			defer unlock()
			img, again := b.Cache.lookup(key)
			if again == nil { // built while we waited
				b.Cache.count(nil)
				return Built{Image: img}, nil
			}
			if !errors.Is(miss, errCorrupt) {
				miss = again
			}
		case ctx.Err() != nil:
			return Built{}, ctx.Err()
		case lctx.Err() != nil:
			// The holder kept the lock past LockWait: compile here
			// without it, and look once more first.
			if img, again := b.Cache.lookup(key); again == nil {
				b.Cache.count(nil)
				return Built{Image: img}, nil
			}
		}
		b.Cache.count(miss)
	}
	img, err := b.compile(ctx, req)
	if err != nil {
		return Built{}, err
	}
	if keyed {
		_ = b.Cache.Put(key, img) // best effort: a read-only cache only costs time
	}
	return Built{Image: img, Compiled: true}, nil
}

// lockWait is LockWait, or DefaultLockWait for 0.
func (b *Builder) lockWait() time.Duration {
	if b.LockWait > 0 {
		return b.LockWait
	}
	return DefaultLockWait
}

// key is the request's cache key; false when there is no cache or no key
// (NVRTC could not be loaded: compiling will say why).
func (b *Builder) key(req CompileRequest) (CacheKey, bool) {
	if b.Cache == nil {
		return CacheKey{}, false
	}
	if b.Compiler != "" {
		return b.Cache.keyFor(req, b.Compiler), true
	}
	k, err := b.Cache.Key(req)
	return k, err == nil
}

func (b *Builder) compile(ctx context.Context, req CompileRequest) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b.Compile != nil {
		return b.Compile(ctx, req)
	}
	select { // NVRTC: at most one compile per CPU in this process
	case nvrtcSlots <- struct{}{}:
		defer func() { <-nvrtcSlots }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return Compile(ctx, req)
}

// nvrtcSlots bounds the NVRTC compiles of all Builders of this process
// (goroutine ranks each have one) to one per CPU: more only costs memory.
var nvrtcSlots = make(chan struct{}, runtime.NumCPU())
