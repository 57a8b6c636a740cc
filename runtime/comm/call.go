package comm

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/schedule"
)

// call is one collective call, resolved once by the front end (resolve)
// into the plan that everything after reads: the debug check's
// fingerprint, the backend's refusal checks and its launch. Nothing
// downstream looks a kernel up again or recomputes a size.
type call struct {
	// As the caller passed them.
	collective coll.Collective
	in, out    Buffer
	count      int64 // all-reduce: elements; reduce-scatter: recvCount; all-gather: sendCount
	dtype      coll.DType
	op         coll.Op // "" for all-gather
	o          Options

	// Sizes, overflow-checked (coll.DType.Bytes) before anything uses them.
	esize             int64 // bytes per element
	n                 int64 // elements of the full buffer (schedule convention): count, or WorldSize*count
	bytes             int64 // n*esize: the size selection rules see
	inBytes, outBytes int64

	// The plan, filled by choose and the backend's prepare.
	alg    coll.Algorithm  // a generated algorithm or coll.NCCL
	kernel *kernels.Kernel // GPU, generated algorithm: the kernel to launch
	chunk  int64           // GPU kernel: chunk elements (schedule.ChunkElems)
	window int64           // GPU kernel: elements of each chunk per round (cg_window); chunk for one round
	sym    zeroCopy        // GPU: the input's symmetric buffer, looked up once per call (zero value: none)
	zc     zeroCopy        // GPU kernel: where the input is read in place (zero value: staged)
}

// backend executes resolved calls: the GPU (gpuComm) or the host
// (hostBackend). It neither parses nor re-validates arguments.
type backend interface {
	// memory is the kind of Buffer the backend takes.
	memory() memKind
	// rules returns the size rules for a collective, nil if there are none.
	rules(collective coll.Collective) *kernels.Selection
	// symmetricInput looks cl's input up once per call (recording it in
	// cl.sym for prepare) and reports whether it lies in symmetric memory
	// the backend reads in place (the rules' symmetric: true rules apply).
	symmetricInput(cl *call) bool
	// prepare checks that cl.alg can run cl and fills the backend's part of
	// the plan. With auto (the rules chose cl.alg) it may fall back to
	// another algorithm, the same on every rank; without, it refuses with
	// the reason.
	prepare(cl *call, auto bool) error
	// run executes a prepared call with a nonzero count.
	run(cl *call) error
	// close releases the backend's resources.
	close() error
}

// do is the front end of every collective: resolve once, cross-check in
// the debug mode, then run. It takes the call by value: a GPU call is
// planned in the communicator's one call record (cur, guarded by busy),
// so the per-call path allocates nothing; host calls, which may run
// concurrently, get their own.
func (c *Communicator) do(in call) error {
	// Before the debug check: peers of a closed rank are not calling.
	if err := c.gone(string(in.collective)); err != nil {
		return err
	}
	if ctx := in.o.Context; ctx != nil && ctx.Err() != nil {
		// Take no part at all: half a collective (inputs offered, then
		// the wait refused) could let peers finish while this rank fails.
		// The cause says why; ctx.Err (cancelled, or past the deadline)
		// gives the kind even where a cause of the caller's replaces it.
		done := ctx.Err()
		if cause := context.Cause(ctx); !errors.Is(cause, done) {
			done = fmt.Errorf("%w (%w)", cause, done)
		}
		return classify(fmt.Errorf("comm: rank %d: %s not started: its Options.Context is done: %w", c.cfg.Rank, in.collective, done))
	}
	var cl *call
	if c.gpu != nil || c.hier != nil {
		if !c.busy.TryLock() {
			return errorf(ErrBusy, "comm: rank %d: %s called while another goroutine's collective is in progress on this GPU communicator; issue one communicator's calls from one goroutine at a time (they share sequence counters and stage slots)",
				c.cfg.Rank, in.collective)
		}
		defer func() {
			c.cur = call{} // keep no reference to the caller's stream or context
			c.busy.Unlock()
		}()
		// Again under busy: a Close or Abort that finished between the
		// check above and TryLock has released the device.
		if err := c.gone(string(in.collective)); err != nil {
			return err
		}
		c.cur = in
		cl = &c.cur
	} else {
		cl = new(call)
		*cl = in
	}
	err := c.resolve(cl)
	if b, k := c.book(), c.check; b != nil || k != nil {
		f := fingerprintOf(cl, err)
		if b != nil {
			b.log.add(f)
		}
		if k != nil {
			if cerr := k.compare(c, cl, f); cerr != nil {
				return cerr
			}
		}
	}
	if err != nil || cl.n == 0 {
		return err
	}
	if err := c.b.run(cl); err != nil {
		if c.aborted.Load() { // whatever the device saw, Abort caused it
			return c.abortedError(string(cl.collective))
		}
		return classify(err)
	}
	return nil
}

// book is the GPU backend's call book (calllog.go), nil on the host
// backend.
func (c *Communicator) book() *callBook {
	switch {
	case c.gpu != nil:
		return c.gpu.calls
	case c.hier != nil:
		return c.hier.calls
	}
	return nil
}

// resolve checks a call's arguments and plans it: sizes first, without
// overflow, then the buffers, then the algorithm. A count of 0 is valid
// and plans nothing.
func (c *Communicator) resolve(cl *call) error {
	if err := c.checkKind(cl.collective, cl.dtype, cl.op); err != nil {
		return err
	}
	if !cl.o.Algorithm.Valid() {
		_, err := coll.ParseAlgorithm(string(cl.o.Algorithm))
		return errorf(ErrInvalidArgument, "comm: %s: %w", cl.collective, err)
	}
	if cl.count < 0 {
		return errorf(ErrInvalidArgument, "comm: %s: negative count %d", cl.collective, cl.count)
	}
	if err := c.size(cl); err != nil {
		return err
	}
	if err := c.checkBuffer(cl, "input", cl.in, cl.inBytes); err != nil {
		return err
	}
	if err := c.checkBuffer(cl, "output", cl.out, cl.outBytes); err != nil {
		return err
	}
	if cl.n == 0 {
		return nil
	}
	return c.choose(cl)
}

// checkKind checks the collective, dtype and op of a call or of Choose.
func (c *Communicator) checkKind(collective coll.Collective, dtype coll.DType, op coll.Op) error {
	if !collective.Valid() {
		_, err := coll.ParseCollective(string(collective))
		return errorf(ErrInvalidArgument, "comm: %w", err)
	}
	if !dtype.Valid() {
		_, err := coll.ParseDType(string(dtype))
		return errorf(ErrInvalidArgument, "comm: %s: %w", collective, err)
	}
	if !collective.Reduces() {
		return nil
	}
	if !op.Valid() {
		_, err := coll.ParseOp(string(op))
		return errorf(ErrInvalidArgument, "comm: %s: %w", collective, err)
	}
	if dtype.IsFloat8() {
		return errorf(ErrInvalidArgument, "comm: %s: %s is copy-only (all-gather); it cannot be reduced", collective, dtype)
	}
	return nil
}

// size fills the call's sizes from its count, refusing one whose bytes do
// not fit in an int64.
func (c *Communicator) size(cl *call) error {
	w := int64(c.cfg.WorldSize)
	full := int64(1)
	if cl.collective != coll.AllReduce {
		full = w
	}
	bytes, ok := cl.dtype.Bytes(cl.count, full)
	if !ok {
		return errorf(ErrInvalidArgument, "comm: %s: %d %s elements (times world size %d) overflow a byte size", cl.collective, cl.count, cl.dtype, full)
	}
	cl.esize = int64(cl.dtype.Size())
	cl.n, cl.bytes = cl.count*full, bytes
	cl.inBytes, cl.outBytes = bytes, bytes
	switch cl.collective {
	case coll.ReduceScatter:
		cl.outBytes = cl.count * cl.esize
	case coll.AllGather:
		cl.inBytes = cl.count * cl.esize
	}
	return nil
}

// checkBuffer checks one buffer of a call: its kind matches the backend,
// a typed buffer's dtype matches the call's, and host memory is long
// enough and aligned for the element type. Its messages name nothing
// rank-specific, so the debug check sees the same refusal on every rank as
// agreement.
func (c *Communicator) checkBuffer(cl *call, name string, b Buffer, need int64) error {
	want := c.b.memory()
	switch {
	case b.kind == noMemory:
		return errorf(ErrInvalidArgument, "comm: %s: the %s is the zero Buffer; wrap memory with %s", cl.collective, name, want)
	case b.kind != want && want == hostMemory:
		return errorf(ErrInvalidArgument, "comm: %s: the %s is a DeviceBuffer given to a host communicator (Config.Device = comm.Host); pass host memory with HostBuffer or HostSlice", cl.collective, name)
	case b.kind != want:
		return errorf(ErrInvalidArgument, "comm: %s: the %s is a HostBuffer given to a GPU communicator; pass device memory with DeviceBuffer, or use Config.Device = comm.Host for CPU ranks", cl.collective, name)
	case b.dtype != "" && b.dtype != cl.dtype:
		return errorf(ErrInvalidArgument, "comm: %s: the %s holds %s elements but the call's dtype is %s", cl.collective, name, b.dtype, cl.dtype)
	case b.kind == deviceMemory:
		if b.dev == 0 && need > 0 {
			return errorf(ErrInvalidArgument, "comm: %s: the %s is DeviceBuffer(0)", cl.collective, name)
		}
		// Kernels load and store whole elements: an address off their
		// alignment faults the context (misaligned address, sticky).
		if size := uintptr(cl.dtype.Size()); size > 0 && uintptr(b.dev)%size != 0 {
			return errorf(ErrInvalidArgument, "comm: %s: the %s is not %d-byte aligned for %s", cl.collective, name, size, cl.dtype)
		}
		return nil
	}
	if int64(len(b.host)) < need {
		return errorf(ErrInvalidArgument, "comm: %s: the %s has %d bytes; %d %s elements need %d", cl.collective, name, len(b.host), cl.count, cl.dtype, need)
	}
	if len(b.host) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b.host)))%uintptr(cl.dtype.Size()) != 0 {
		return errorf(ErrInvalidArgument, "comm: %s: the %s is not %d-byte aligned for %s", cl.collective, name, cl.dtype.Size(), cl.dtype)
	}
	return nil
}

// choose picks the call's algorithm: the caller's, checked, or the rules'
// (kernels.Selection.Choose, the runtime's one selection function; NCCL
// where no rule covers the size), which the backend may still send to NCCL.
func (c *Communicator) choose(cl *call) error {
	symmetric := c.b.symmetricInput(cl)
	if cl.o.Algorithm != coll.Auto {
		cl.alg = cl.o.Algorithm
		return c.b.prepare(cl, false)
	}
	cl.alg = coll.NCCL
	if sel := c.b.rules(cl.collective); sel != nil {
		cl.alg = coll.Algorithm(sel.Choose(cl.bytes, symmetric))
	}
	return c.b.prepare(cl, true)
}

// chooseCall is the call Choose resolves: bytes of the full buffer, no
// buffers.
func (c *Communicator) chooseCall(collective coll.Collective, bytes int64, dtype coll.DType, op coll.Op) (*call, error) {
	if err := c.gone("Choose"); err != nil {
		return nil, err
	}
	if !collective.Reduces() {
		op = ""
	}
	if err := c.checkKind(collective, dtype, op); err != nil {
		return nil, err
	}
	if bytes < 0 {
		return nil, errorf(ErrInvalidArgument, "comm: Choose: negative size %d", bytes)
	}
	esize := int64(dtype.Size())
	cl := &call{collective: collective, dtype: dtype, op: op, esize: esize, n: bytes / esize, bytes: bytes}
	cl.count = cl.n
	if collective != coll.AllReduce {
		cl.count = cl.n / int64(c.cfg.WorldSize)
	}
	return cl, nil
}

// chunkElems is schedule.ChunkElems for a call and a kernel's vector width.
func chunkElems(cl *call, world int, k *kernels.Kernel) int64 {
	return int64(schedule.ChunkElems(cl.collective, int(cl.n), world, int(k.VecElems(int(cl.esize)))))
}
