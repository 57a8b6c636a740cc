// Package cuda renders a plan's kernels into CUDA C++ source with
// text/template (plus an allowlist of sprig functions). All arithmetic and
// naming happens in Go helper methods on the template contexts below; the
// templates only lay out text.
package cuda

import (
	"bytes"
	"embed"
	"fmt"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/plan"
	"github.com/collgen/collgen/schedule"
)

//go:embed *.tmpl
var files embed.FS

// Files returns the template files' names and contents, for the manifest.
func Files() map[string][]byte {
	out := map[string][]byte{}
	entries, _ := files.ReadDir(".")
	for _, e := range entries {
		b, _ := files.ReadFile(e.Name())
		out["templates/cuda/"+e.Name()] = b
	}
	return out
}

// HeaderName is the file name of the common device header every kernel
// includes.
const HeaderName = "collgen_common.cuh"

// SymmHeaderName is the file name of the device header for users' kernels
// over runtime/symm's symmetric memory (symm.cuh.tmpl). No generated
// kernel includes it; runtime/symm embeds the same bytes (symm.DeviceHeader).
const SymmHeaderName = "collgen_symm.cuh"

// SymmHeader renders collgen_symm.cuh, which depends on no plan.
func SymmHeader() ([]byte, error) {
	t, err := parse()
	if err != nil {
		return nil, fmt.Errorf("parse CUDA templates: %w", err)
	}
	return execute(t, "symm.cuh", SymmHeaderName, nil)
}

// execute renders template name with data; file names the output in errors.
func execute(t *template.Template, name, file string, data any) ([]byte, error) {
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, name, data); err != nil {
		return nil, fmt.Errorf("render %s: %w", file, err)
	}
	return buf.Bytes(), nil
}

// sprigAllowed lists the sprig functions templates use: deterministic,
// side-effect-free string helpers only (sprig's map also has random and
// crypto functions, which would break byte-for-byte reproducible output).
// kernel.cu.tmpl comments the schedule out with trimSuffix and replace, and
// lays out lookup tables with join.
var sprigAllowed = []string{"join", "replace", "trimSuffix"}

func parse() (*template.Template, error) {
	all := sprig.TxtFuncMap()
	funcs := template.FuncMap{}
	for _, name := range sprigAllowed {
		funcs[name] = all[name]
	}
	return template.New("cuda").Funcs(funcs).Option("missingkey=error").ParseFS(files, "*.tmpl")
}

// Render returns the header and one .cu file per kernel, keyed by file name.
func Render(p *plan.Plan) (map[string][]byte, error) {
	t, err := parse()
	if err != nil {
		return nil, fmt.Errorf("parse CUDA templates: %w", err)
	}
	out := map[string][]byte{}
	if out[HeaderName], err = execute(t, "common.cuh", HeaderName, struct{ Plan *plan.Plan }{p}); err != nil {
		return nil, err
	}
	if out[SymmHeaderName], err = execute(t, "symm.cuh", SymmHeaderName, nil); err != nil {
		return nil, err
	}
	for _, k := range p.Kernels {
		ctx, err := newKernelContext(k)
		if err != nil {
			return nil, err
		}
		if out[k.File()], err = execute(t, "kernel.cu", k.File(), ctx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// kernelContext is what kernel.cu.tmpl sees.
type kernelContext struct {
	K        *plan.Kernel
	Traits   string // cg_bf16
	OpStruct string // cg_sum
	Tables   []table
	Phases   []phaseContext
	Barriers int
	// FinalOptional: the last barrier runs only with one stage slot
	// (schedule.FinalBarrierRemovable); BarriersWithoutFinal counts the rest.
	FinalOptional        bool
	BarriersWithoutFinal int
	UsesStage            bool // some step touches Stage (needs the slot)
	// LL: the schedule uses a push protocol (coll.Protocol.Push); its
	// steps are rendered as fused unit loops (see llGroups) with no
	// barriers, over the protocol struct Proto (cg_ll or cg_ll128).
	LL    bool
	Proto string
}

// table is a lookup table of the executing rank: Values[rank].
type table struct {
	Name   string
	Values []int
}

// phaseContext is one phase of the kernel: its steps and closing barrier.
type phaseContext struct {
	Steps     []stepContext
	Sync      bool
	SeqOffset int  // this barrier's sequence value is seq + SeqOffset
	Optional  bool // the final barrier, skipped when stage slots alternate
}

// stepContext is one C block: a comment naming the step(s) and its lines.
type stepContext struct {
	Comment string
	Lines   []string
}

// newKernelContext renders a kernel's schedule into the context
// kernel.cu.tmpl lays out.
func newKernelContext(k *plan.Kernel) (*kernelContext, error) {
	e := &kernelEmitter{k: k, s: k.Schedule, byValues: map[string]string{}}
	return e.context()
}

// kernelEmitter turns one kernel's schedule into C: it names indices,
// buffers and lookup tables, and records what the kernel uses (tables, the
// stage slot) as it emits them, so the template context is complete once
// every step is written (as protogen's GeneratedFile tracks its imports).
type kernelEmitter struct {
	k *plan.Kernel
	s *schedule.Schedule
	// tables are the lookup tables declared so far, in order of first use,
	// and byValues maps a table's values to its name.
	tables   []table
	byValues map[string]string // fmt.Sprint(values) -> name
	// usesStage: some emitted expression addresses the stage buffer.
	usesStage bool
}

// context emits every phase and returns the template context.
func (e *kernelEmitter) context() (*kernelContext, error) {
	k, s := e.k, e.s
	c := &kernelContext{K: k, Traits: "cg_" + string(k.DType), OpStruct: "cg_" + string(k.Op), Barriers: s.Barriers(),
		FinalOptional: schedule.FinalBarrierRemovable(s)}
	c.BarriersWithoutFinal = c.Barriers - 1
	var err error
	if s.Protocol.Push() {
		c.LL, c.Proto = true, "cg_"+string(s.Protocol)
		c.Phases, err = e.pushPhases()
	} else {
		c.Phases, err = e.barrierPhases()
		if err == nil && c.FinalOptional {
			c.Phases[len(c.Phases)-1].Optional = true
		}
	}
	if err != nil {
		return nil, err
	}
	c.Tables, c.UsesStage = e.tables, e.usesStage
	return c, nil
}

// index returns the C expression of an index of the executing rank; a
// table index declares its table on first use.
func (e *kernelEmitter) index(x schedule.Index) string {
	switch x.Kind {
	case schedule.Const:
		return fmt.Sprint(x.K)
	case schedule.RankPlus:
		if x.K == 0 {
			return "rank"
		}
		return fmt.Sprintf("cg_rel(rank, %d, W)", x.K)
	}
	key := fmt.Sprint(x.Table)
	name, ok := e.byValues[key]
	if !ok {
		name = fmt.Sprintf("table%d", len(e.tables))
		e.byValues[key] = name
		e.tables = append(e.tables, table{Name: name, Values: x.Table})
	}
	return name + "[rank]"
}

// single reports whether a buffer holds one chunk (reduce-scatter's output,
// all-gather's input) rather than W.
func (e *kernelEmitter) single(b schedule.Buffer) bool {
	return b == schedule.Input && e.s.InChunks == 1 || b == schedule.Output && e.s.OutChunks == 1
}

// ref returns the C expression of a ref's first element.
func (e *kernelEmitter) ref(r schedule.Ref, constant bool) string {
	q := "E*"
	if constant {
		q = "const E*"
	}
	var base string
	switch r.Buf {
	case schedule.Input:
		base = fmt.Sprintf("(%s)a.input", q)
	case schedule.Output:
		base = fmt.Sprintf("(%s)a.output", q)
	case schedule.Stage:
		e.usesStage = true
		base = fmt.Sprintf("(%s)cg_slot(a.stage[%s], slot, a.slot_bytes)", q, e.index(r.Rank))
	case schedule.Inbox: // LL: lane and chunk place it inside the stage slot
		return fmt.Sprintf("cg_inbox<W>(a.stage[%s], slot, a.slot_bytes, %s, %s, chunk_ll)", e.index(r.Rank), e.index(r.Lane), e.index(r.Chunk))
	default:
		base = fmt.Sprintf("(%s)a.%s[%s]", q, r.Buf, e.index(r.Rank))
	}
	if e.single(r.Buf) {
		return base
	}
	return fmt.Sprintf("%s + cg_chunk(a.count, a.chunk, %s).lo", base, e.index(r.Chunk))
}

// chunkOf is the ref whose chunk index sets a step's work-split shift: the
// destination's, or for a one-chunk destination its first source's.
func (e *kernelEmitter) chunkOf(st schedule.Step) schedule.Ref {
	if e.single(st.Dst.Buf) {
		return st.Srcs[0]
	}
	return st.Dst
}

// barrierPhases emits a barrier (pull) schedule: one block per step, and
// each barrier's sequence offset.
func (e *kernelEmitter) barrierPhases() ([]phaseContext, error) {
	var phases []phaseContext
	seq := 0
	for _, ph := range e.s.Phases {
		pc := phaseContext{Sync: ph.Sync}
		for _, st := range ph.Steps {
			sc, err := e.barrierStep(st)
			if err != nil {
				return nil, err
			}
			pc.Steps = append(pc.Steps, sc)
		}
		if ph.Sync {
			seq++
			pc.SeqOffset = seq
		}
		phases = append(phases, pc)
	}
	return phases, nil
}

// barrierStep emits one copy or reduce over a chunk.
func (e *kernelEmitter) barrierStep(st schedule.Step) (stepContext, error) {
	w := &stepWriter{sc: stepContext{Comment: stepComment(st)}}
	n := "(cg_s64)a.chunk"
	if !e.single(st.Dst.Buf) {
		n = fmt.Sprintf("cg_chunk(a.count, a.chunk, %s).n", e.index(st.Dst.Chunk))
	}
	w.P("const cg_s64 n = %s;", n)
	w.P("const cg_s64 shift = cg_shift(%s, a.chunk, VB / sizeof(E));", e.index(e.chunkOf(st).Chunk))
	switch st.Kind {
	case schedule.Copy:
		dst := e.ref(st.Dst, false)
		w.P("cg_copy<T, VB>(%s, %s, n, shift);", dst, e.ref(st.Srcs[0], true))
	case schedule.Reduce:
		if e.k.Op == "" {
			return w.sc, fmt.Errorf("kernel %s: reduce step without an op", e.k.Name)
		}
		w.P("const E* const src[%d] = {", len(st.Srcs))
		for i, r := range st.Srcs {
			comma := ","
			if i == len(st.Srcs)-1 {
				comma = ""
			}
			w.P("    %s%s", e.ref(r, true), comma)
		}
		w.P("};")
		w.P("cg_reduce<T, OP, %d, VB>(%s, src, n, shift);", len(st.Srcs), e.ref(st.Dst, false))
	}
	return w.sc, nil
}

// pushPhases emits a push (LL, LL128) schedule: each phase's steps in
// fused groups (llGroups), one loop each.
func (e *kernelEmitter) pushPhases() ([]phaseContext, error) {
	var phases []phaseContext
	for pi, ph := range e.s.Phases {
		pc := phaseContext{}
		for _, g := range llGroups(ph.Steps) {
			sc, err := e.pushGroup(g, pi)
			if err != nil {
				return nil, err
			}
			pc.Steps = append(pc.Steps, sc)
		}
		phases = append(phases, pc)
	}
	return phases, nil
}

// stepWriter accumulates one step's C lines: P appends a line to the
// step's preamble, B one to the loop body of a push group (protogen's
// GeneratedFile.P). It counts the pointers declared in it
// (kernelEmitter.ptr) and records whether the body passes `on` to a
// protocol call.
type stepWriter struct {
	sc     stepContext
	body   []string
	ptrs   int
	usesOn bool
}

// P appends a formatted line to the step.
func (w *stepWriter) P(format string, args ...any) {
	w.sc.Lines = append(w.sc.Lines, fmt.Sprintf(format, args...))
}

// B appends a formatted line to the loop body.
func (w *stepWriter) B(format string, args ...any) {
	w.body = append(w.body, "  "+fmt.Sprintf(format, args...))
}

// ptr declares, in w before the loop, a pointer to a ref's chunk and
// returns its name (p0, p1, ...); inbox pointers are bytes (16-byte units).
func (e *kernelEmitter) ptr(w *stepWriter, r schedule.Ref, constant bool) string {
	name := fmt.Sprintf("p%d", w.ptrs)
	w.ptrs++
	typ := "E*"
	if r.Buf == schedule.Inbox {
		typ = "char*"
	}
	if constant {
		typ = "const " + typ
	}
	w.P("%s const %s = %s;", typ, name, e.ref(r, constant))
	return name
}

// stepComment renders a step for the generated code's comments.
func stepComment(st schedule.Step) string {
	srcs := make([]string, len(st.Srcs))
	for i, r := range st.Srcs {
		srcs[i] = r.String()
	}
	return fmt.Sprintf("%s <- %s(%s)", st.Dst, st.Kind, strings.Join(srcs, ", "))
}

// llGroups splits an LL phase into groups rendered as one loop each: a lead
// step and the puts right after it that send the lead's value (its source,
// for a put; its destination, otherwise). Fusing is what makes a
// reduce-then-put correct without a barrier: the thread that computes a
// line is the thread that sends it (schedule.Validate requires every put of
// a computed value to follow its step).
func llGroups(steps []schedule.Step) [][]schedule.Step {
	var groups [][]schedule.Step
	for i := 0; i < len(steps); {
		lead := steps[i]
		value := lead.Dst
		if lead.Kind == schedule.Put {
			value = lead.Srcs[0]
		}
		j := i + 1
		for j < len(steps) && steps[j].Kind == schedule.Put && steps[j].Srcs[0].Equal(value) {
			j++
		}
		groups = append(groups, steps[i:j])
		i = j
	}
	return groups
}

// pushGroup renders one push group as a loop over the 16-byte inbox units
// of its chunk, through the protocol struct PR (common.cuh.tmpl). Every
// step of a kernel that touches chunk c uses the same work-split shift (c
// times the units per chunk), so one thread handles unit u of chunk c in
// every phase. LL128 loops are warp uniform (every lane of a warp runs
// every iteration; see common.cuh.tmpl), so the 8 threads of a line, and
// the whole warp, reach every poll and store together.
func (e *kernelEmitter) pushGroup(g []schedule.Step, phase int) (stepContext, error) {
	lead := g[0]
	comments := make([]string, len(g))
	for i, st := range g {
		comments[i] = stepComment(st)
	}
	w := &stepWriter{sc: stepContext{Comment: strings.Join(comments, "; ")}}
	chunkRef := e.chunkOf(lead)
	if e.single(chunkRef.Buf) {
		w.P("const cg_span sp = {0, (cg_s64)a.chunk};")
	} else {
		w.P("const cg_span sp = cg_chunk(a.count, a.chunk, %s);", e.index(chunkRef.Chunk))
	}
	w.P("const cg_s64 units = PR::units<E>(sp.n);")
	// LL128 loops are warp uniform: they run while any lane of the warp
	// has a unit, and a lane past the span passes on = false to the
	// protocol calls (common.cuh.tmpl). LL loops are per thread.
	warp := e.s.Protocol == coll.LL128
	on, notOK, cond := "", "!ok", "u < units"
	if warp {
		on, notOK, cond = ", on", "PR::any(!ok)", "PR::any(u < units)"
	}
	w.P("const cg_s64 stride = (cg_s64)gridDim.x * blockDim.x;")
	puts := g[1:]
	switch lead.Kind {
	case schedule.Put:
		src := e.ptr(w, lead.Srcs[0], true)
		w.B("const PR::P x = PR::ld(%s, u, sp.n);", src)
		puts = g
	case schedule.Copy:
		src := e.ptr(w, lead.Srcs[0], true)
		dst := e.ptr(w, lead.Dst, false)
		if lead.Srcs[0].Buf == schedule.Inbox {
			w.usesOn = true
			w.B("PR::P x;")
			w.B("if (!cg_push_wait<PR>(a, %s + u * 16, flag, x, %s, %d%s)) goto done;", src, e.index(lead.Srcs[0].Lane), phase, on)
		} else {
			w.B("const PR::P x = PR::ld(%s, u, sp.n);", src)
		}
		w.B("PR::st(%s, u, sp.n, x);", dst)
	case schedule.Reduce:
		if e.k.Op == "" {
			return w.sc, fmt.Errorf("kernel %s: reduce step without an op", e.k.Name)
		}
		srcs := make([]string, len(lead.Srcs))
		for i, r := range lead.Srcs {
			srcs[i] = e.ptr(w, r, true)
		}
		dst := e.ptr(w, lead.Dst, false)
		w.B("PR::P xs[%d];", len(srcs))
		w.B("bool ok = true;")
		anyLL := false
		for i, r := range lead.Srcs {
			if r.Buf == schedule.Inbox {
				anyLL, w.usesOn = true, true
				w.B("ok &= PR::poll(%s + u * 16, flag, xs[%d]%s);", srcs[i], i, on)
			} else {
				w.B("xs[%d] = PR::ld(%s, u, sp.n);", i, srcs[i])
			}
		}
		if anyLL {
			w.B("if (%s) {", notOK)
			for i, r := range lead.Srcs {
				if r.Buf == schedule.Inbox {
					w.B("  if (!cg_push_wait<PR>(a, %s + u * 16, flag, xs[%d], %s, %d%s)) goto done;", srcs[i], i, e.index(r.Lane), phase, on)
				}
			}
			w.B("}")
		}
		w.B("const PR::P x = PR::reduce<T, OP, %d>(xs);", len(srcs))
		w.B("PR::st(%s, u, sp.n, x);", dst)
	}
	for _, p := range puts {
		w.usesOn = true
		w.B("PR::store(%s + u * 16, x, flag%s);", e.ptr(w, p.Dst, false), on)
	}
	w.P("for (cg_s64 u = cg_first((cg_s64)%s * PR::units<E>(a.chunk), stride); %s; u += stride) {", e.index(chunkRef.Chunk), cond)
	if warp && w.usesOn {
		w.P("  const bool on = u < units;")
	}
	w.sc.Lines = append(w.sc.Lines, w.body...)
	w.P("}")
	return w.sc, nil
}
