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

// sprigAllowed lists the sprig functions templates may use: deterministic,
// side-effect-free string helpers only (sprig's map also has random and
// crypto functions, which would break byte-for-byte reproducible output).
var sprigAllowed = []string{"join", "indent", "nindent", "trim", "upper", "lower", "replace", "quote"}

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
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "common.cuh", struct{ Plan *plan.Plan }{p}); err != nil {
		return nil, fmt.Errorf("render %s: %w", HeaderName, err)
	}
	out[HeaderName] = append([]byte(nil), buf.Bytes()...)
	for _, k := range p.Kernels {
		buf.Reset()
		ctx, err := newKernelContext(k)
		if err != nil {
			return nil, err
		}
		if err := t.ExecuteTemplate(&buf, "kernel.cu", ctx); err != nil {
			return nil, fmt.Errorf("render %s: %w", k.File(), err)
		}
		out[k.File()] = append([]byte(nil), buf.Bytes()...)
	}
	return out, nil
}

// kernelContext is what kernel.cu.tmpl sees.
type kernelContext struct {
	K               *plan.Kernel
	Traits          string // cg_bf16
	OpStruct        string // cg_sum
	ScheduleComment string
	Tables          []table
	Phases          []phaseContext
	Barriers        int
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

type table struct{ Name, Values string }

type phaseContext struct {
	Steps     []stepContext
	Sync      bool
	SeqOffset int  // this barrier's sequence value is seq + SeqOffset
	Optional  bool // the final barrier, skipped when stage slots alternate
}

type stepContext struct {
	Comment string
	Lines   []string
}

func newKernelContext(k *plan.Kernel) (*kernelContext, error) {
	s := k.Schedule
	c := &kernelContext{K: k, Traits: "cg_" + string(k.DType), OpStruct: "cg_" + string(k.Op), Barriers: s.Barriers(),
		FinalOptional: schedule.FinalBarrierRemovable(s)}
	c.BarriersWithoutFinal = c.Barriers - 1
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(s.String(), "\n"), "\n") {
		lines = append(lines, "//   "+l)
	}
	c.ScheduleComment = strings.Join(lines, "\n")
	tables := map[string]string{} // values -> name
	idx := func(x schedule.Index) string {
		switch x.Kind {
		case schedule.Const:
			return fmt.Sprint(x.K)
		case schedule.RankPlus:
			if x.K == 0 {
				return "rank"
			}
			return fmt.Sprintf("cg_rel(rank, %d, W)", x.K)
		}
		vals := make([]string, len(x.Table))
		for i, v := range x.Table {
			vals[i] = fmt.Sprint(v)
		}
		key := strings.Join(vals, ", ")
		name, ok := tables[key]
		if !ok {
			name = fmt.Sprintf("table%d", len(c.Tables))
			tables[key] = name
			c.Tables = append(c.Tables, table{Name: name, Values: key})
		}
		return name + "[rank]"
	}
	single := func(b schedule.Buffer) bool {
		return b == schedule.Input && s.InChunks == 1 || b == schedule.Output && s.OutChunks == 1
	}
	// ptr returns the C expression of a ref's first element.
	ptr := func(r schedule.Ref, constant bool) string {
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
			c.UsesStage = true
			base = fmt.Sprintf("(%s)cg_slot(a.stage[%s], slot, a.slot_bytes)", q, idx(r.Rank))
		case schedule.Inbox: // LL: lane and chunk place it inside the stage slot
			return fmt.Sprintf("cg_inbox<W>(a.stage[%s], slot, a.slot_bytes, %s, %s, chunk_ll)", idx(r.Rank), idx(r.Lane), idx(r.Chunk))
		default:
			base = fmt.Sprintf("(%s)a.%s[%s]", q, r.Buf, idx(r.Rank))
		}
		if single(r.Buf) {
			return base
		}
		return fmt.Sprintf("%s + cg_chunk(a.count, a.chunk, %s).lo", base, idx(r.Chunk))
	}
	if s.Protocol.Push() {
		c.LL = true
		c.Proto = "cg_" + string(s.Protocol)
		for pi, ph := range s.Phases {
			pc := phaseContext{}
			for _, g := range llGroups(ph.Steps) {
				sc, err := llGroup(k, g, pi, idx, single, ptr)
				if err != nil {
					return nil, err
				}
				pc.Steps = append(pc.Steps, sc)
			}
			c.Phases = append(c.Phases, pc)
		}
		return c, nil
	}
	seq := 0
	for _, ph := range s.Phases {
		pc := phaseContext{Sync: ph.Sync}
		for _, st := range ph.Steps {
			sc := stepContext{Comment: stepComment(st)}
			n := "(cg_s64)a.chunk"
			if !single(st.Dst.Buf) {
				n = fmt.Sprintf("cg_chunk(a.count, a.chunk, %s).n", idx(st.Dst.Chunk))
			}
			sc.Lines = append(sc.Lines, "const cg_s64 n = "+n+";")
			// The work-split shift comes from the step's chunk index: the
			// destination's, or for a one-chunk destination its sources'.
			chunkRef := st.Dst
			if single(chunkRef.Buf) {
				chunkRef = st.Srcs[0]
			}
			sc.Lines = append(sc.Lines, fmt.Sprintf("const cg_s64 shift = cg_shift(%s, a.chunk, VB / sizeof(E));", idx(chunkRef.Chunk)))
			switch st.Kind {
			case schedule.Copy:
				sc.Lines = append(sc.Lines, fmt.Sprintf("cg_copy<T, VB>(%s, %s, n, shift);", ptr(st.Dst, false), ptr(st.Srcs[0], true)))
			case schedule.Reduce:
				if k.Op == "" {
					return nil, fmt.Errorf("kernel %s: reduce step without an op", k.Name)
				}
				sc.Lines = append(sc.Lines, fmt.Sprintf("const E* const src[%d] = {", len(st.Srcs)))
				for i, r := range st.Srcs {
					comma := ","
					if i == len(st.Srcs)-1 {
						comma = ""
					}
					sc.Lines = append(sc.Lines, "    "+ptr(r, true)+comma)
				}
				sc.Lines = append(sc.Lines, "};", fmt.Sprintf("cg_reduce<T, OP, %d, VB>(%s, src, n, shift);", len(st.Srcs), ptr(st.Dst, false)))
			}
			pc.Steps = append(pc.Steps, sc)
		}
		if ph.Sync {
			seq++
			pc.SeqOffset = seq
		}
		c.Phases = append(c.Phases, pc)
	}
	if c.FinalOptional {
		c.Phases[len(c.Phases)-1].Optional = true
	}
	return c, nil
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

// llGroup renders one push group as a loop over the 16-byte inbox units of
// its chunk, through the protocol struct PR (common.cuh.tmpl). Every step
// of a kernel that touches chunk c uses the same work-split shift (c times
// the units per chunk), so one thread handles unit u of chunk c in every
// phase. LL128 loops are warp uniform (every lane of a warp runs every
// iteration; see common.cuh.tmpl), so the 8 threads of a line, and the
// whole warp, reach every poll and store together.
func llGroup(k *plan.Kernel, g []schedule.Step, phase int, idx func(schedule.Index) string, single func(schedule.Buffer) bool,
	expr func(schedule.Ref, bool) string) (stepContext, error) {
	lead := g[0]
	comments := make([]string, len(g))
	for i, st := range g {
		comments[i] = stepComment(st)
	}
	sc := stepContext{Comment: strings.Join(comments, "; ")}
	add := func(format string, args ...any) { sc.Lines = append(sc.Lines, fmt.Sprintf(format, args...)) }
	chunkRef := lead.Dst
	if single(chunkRef.Buf) {
		chunkRef = lead.Srcs[0]
	}
	if single(chunkRef.Buf) {
		add("const cg_span sp = {0, (cg_s64)a.chunk};")
	} else {
		add("const cg_span sp = cg_chunk(a.count, a.chunk, %s);", idx(chunkRef.Chunk))
	}
	add("const cg_s64 units = PR::units<E>(sp.n);")
	// LL128 loops are warp uniform: they run while any lane of the warp
	// has a unit, and a lane past the span passes on = false to the
	// protocol calls (common.cuh.tmpl). LL loops are per thread.
	warp := k.Schedule.Protocol == coll.LL128
	on, notOK, cond := "", "!ok", "u < units"
	if warp {
		on, notOK, cond = ", on", "PR::any(!ok)", "PR::any(u < units)"
	}
	usesOn := false // the body passes on to a poll, wait or store
	add("const cg_s64 stride = (cg_s64)gridDim.x * blockDim.x;")
	// ptr declares a pointer to a ref's chunk (expr's expression) and
	// returns its name; inbox pointers are bytes (16-byte units).
	names := 0
	ptr := func(r schedule.Ref, constant bool) string {
		name := fmt.Sprintf("p%d", names)
		names++
		typ := "E*"
		if r.Buf == schedule.Inbox {
			typ = "char*"
		}
		if constant {
			typ = "const " + typ
		}
		add("%s const %s = %s;", typ, name, expr(r, constant))
		return name
	}
	var body []string
	line := func(format string, args ...any) { body = append(body, "  "+fmt.Sprintf(format, args...)) }
	wait := func(src schedule.Ref, p, x string) {
		usesOn = true
		line("if (!cg_push_wait<PR>(a, %s + u * 16, flag, %s, %s, %d%s)) goto done;", p, x, idx(src.Lane), phase, on)
	}
	puts := g[1:]
	switch lead.Kind {
	case schedule.Put:
		src := ptr(lead.Srcs[0], true)
		line("const PR::P x = PR::ld(%s, u, sp.n);", src)
		puts = g
	case schedule.Copy:
		src, dst := ptr(lead.Srcs[0], true), ptr(lead.Dst, false)
		if lead.Srcs[0].Buf == schedule.Inbox {
			line("PR::P x;")
			wait(lead.Srcs[0], src, "x")
		} else {
			line("const PR::P x = PR::ld(%s, u, sp.n);", src)
		}
		line("PR::st(%s, u, sp.n, x);", dst)
	case schedule.Reduce:
		if k.Op == "" {
			return sc, fmt.Errorf("kernel %s: reduce step without an op", k.Name)
		}
		srcs := make([]string, len(lead.Srcs))
		for i, r := range lead.Srcs {
			srcs[i] = ptr(r, true)
		}
		dst := ptr(lead.Dst, false)
		line("PR::P xs[%d];", len(srcs))
		line("bool ok = true;")
		anyLL := false
		for i, r := range lead.Srcs {
			if r.Buf == schedule.Inbox {
				anyLL, usesOn = true, true
				line("ok &= PR::poll(%s + u * 16, flag, xs[%d]%s);", srcs[i], i, on)
			} else {
				line("xs[%d] = PR::ld(%s, u, sp.n);", i, srcs[i])
			}
		}
		if anyLL {
			line("if (%s) {", notOK)
			for i, r := range lead.Srcs {
				if r.Buf == schedule.Inbox {
					line("  if (!cg_push_wait<PR>(a, %s + u * 16, flag, xs[%d], %s, %d%s)) goto done;", srcs[i], i, idx(r.Lane), phase, on)
				}
			}
			line("}")
		}
		line("const PR::P x = PR::reduce<T, OP, %d>(xs);", len(srcs))
		line("PR::st(%s, u, sp.n, x);", dst)
	}
	for _, p := range puts {
		usesOn = true
		line("PR::store(%s + u * 16, x, flag%s);", ptr(p.Dst, false), on)
	}
	add("for (cg_s64 u = cg_first((cg_s64)%s * PR::units<E>(a.chunk), stride); %s; u += stride) {", idx(chunkRef.Chunk), cond)
	if warp && usesOn {
		add("  const bool on = u < units;")
	}
	sc.Lines = append(sc.Lines, body...)
	add("}")
	return sc, nil
}
