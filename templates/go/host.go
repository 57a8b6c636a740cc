package goglue

import (
	"fmt"
	"slices"
	"strings"

	"github.com/dave/jennifer/jen"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/plan"
)

const numericPkg = "github.com/collgen/collgen/runtime/numeric"

// hostType is how a dtype is stored and accumulated by the host loops.
type hostType struct {
	elem    jen.Code // storage type
	acc     jen.Code // accumulator type
	up      string   // numeric function converting elem -> acc ("" = none)
	down    string   // numeric function converting acc -> elem
	goName  string   // F32, BF16, ...
	accName string   // the accumulator's: F32 for f16 and bf16
}

func hostTypeOf(dtype coll.DType) (hostType, error) {
	switch dtype {
	case coll.F32:
		return hostType{jen.Float32(), jen.Float32(), "", "", "F32", "F32"}, nil
	case coll.F64:
		return hostType{jen.Float64(), jen.Float64(), "", "", "F64", "F64"}, nil
	case coll.I32:
		return hostType{jen.Int32(), jen.Int32(), "", "", "I32", "I32"}, nil
	case coll.I64:
		return hostType{jen.Int64(), jen.Int64(), "", "", "I64", "I64"}, nil
	case coll.F16:
		return hostType{jen.Uint16(), jen.Float32(), "F16ToF32", "F32ToF16", "F16", "F32"}, nil
	case coll.BF16:
		return hostType{jen.Uint16(), jen.Float32(), "BF16ToF32", "F32ToBF16", "BF16", "F32"}, nil
	}
	return hostType{}, fmt.Errorf("dtype %s has no host reduce loop", dtype)
}

// hostFused is the largest source count with a loop of its own; more
// sources go through hostBlock-sized blocks (see hostBody).
const hostFused = 8

// hostFile emits one reduce loop per (dtype, op) of the host topology, e.g.
//
//	func reduceBF16Sum(dst []byte, srcs [][]byte) { ... one pass: d[i] = down(up(s0[i]) + up(s1[i]) + ...) ... }
//
// the combine helpers max and min need, and the table hostReducers mapping
// kernels.HostKey to the loops.
func hostFile(p *plan.Plan) *jen.File {
	f := newFile(p, "")
	f.Comment(commentText(fmt.Sprintf("hostBlock is how many elements a host loop accumulates at a time when it has more than %d sources: the accumulator stays in L1 while every source streams through once.", hostFused)))
	f.Const().Id("hostBlock").Op("=").Lit(1024)
	f.Line()
	// func elems[T any](b []byte) []T
	f.Comment(commentText("elems views b as elements of type T (len(b)/size of them; b is element aligned)."))
	f.Func().Id("elems").Types(jen.Id("T").Any()).Params(jen.Id("b").Index().Byte()).Index().Id("T").Block(
		jen.Var().Id("z").Id("T"),
		jen.Return(jen.Qual("unsafe", "Slice").Call(
			jen.Parens(jen.Op("*").Id("T")).Call(jen.Qual("unsafe", "Pointer").Call(jen.Qual("unsafe", "SliceData").Call(jen.Id("b")))),
			jen.Len(jen.Id("b")).Op("/").Int().Call(jen.Qual("unsafe", "Sizeof").Call(jen.Id("z"))))),
	)
	f.Line()
	helpers := map[string]hostCombine{}
	var table []jen.Code
	var loops []jen.Code
	for _, key := range p.HostReducers {
		ht, err := hostTypeOf(key.DType)
		if err != nil {
			// The spec validator only admits host dtypes with loops; skip
			// defensively rather than emit broken code.
			continue
		}
		op := string(key.Op)
		name := "reduce" + ht.goName + strings.ToUpper(op[:1]) + op[1:]
		table = append(table, jen.Values(jen.Id("DType").Op(":").Lit(string(key.DType)), jen.Id("Op").Op(":").Lit(op)).Op(":").Id(name))
		loops = append(loops,
			jen.Comment(commentText(fmt.Sprintf("%s is the host reduce loop for %s %s: dst = srcs[0] %s srcs[1] %s ..., in source order, in one pass for up to %d sources.", name, key.DType, key.Op, key.Op, key.Op, hostFused))).Line().
				Func().Id(name).Params(jen.Id("dst").Index().Byte(), jen.Id("srcs").Index().Index().Byte()).Block(hostBody(ht, key.Op)...).Line())
		if key.Op != coll.Sum {
			helpers[ht.helper(key.Op)] = hostCombine{key.Op, ht.acc, key.DType.IsFloat()}
		}
	}
	for _, h := range sortedKeys(helpers) {
		hostHelper(f, h, helpers[h])
	}
	for _, c := range loops {
		f.Add(c)
	}
	f.Comment(commentText("hostReducers maps each host (dtype, op) to its reduce loop."))
	f.Var().Id("hostReducers").Op("=").Map(jen.Qual(kernelsPkg, "HostKey")).Qual(kernelsPkg, "HostReduceFunc").Custom(multi, table...)
	return f
}

// helper names the combine function of op (max or min) on the
// accumulator type, e.g. maxF32.
func (ht hostType) helper(op coll.Op) string { return string(op) + ht.accName }

// hostCombine is a max or min combine function on an accumulator type.
type hostCombine struct {
	op    coll.Op
	acc   jen.Code
	float bool
}

// hostHelper emits the combine function name ("maxF32", "minI64", ...):
//
//	func maxF32(a, x float32) float32 { if a != a { return x }; if x != x { return a }; return max(a, x) }
//
// Floats follow maxNum/minNum as the CUDA op and NCCL do: a NaN operand is
// ignored unless every operand is NaN, so the result does not depend on
// where the NaN sits (a NaN accumulator takes the next value; a NaN value
// never replaces a number). Between numbers the builtin decides, which
// orders zeros as the GPUs do (max(-0, +0) = +0, min = -0; measured against
// NCCL, docs/numerics.md). Integers use the builtin alone.
func hostHelper(f *jen.File, name string, c hostCombine) {
	op, acc, float := string(c.op), c.acc, c.float
	var body []jen.Code
	doc := fmt.Sprintf("%s returns %s(a, x) for integers.", name, op)
	if float {
		doc = fmt.Sprintf("%s combines accumulator a with value x: a NaN operand is ignored unless both are (maxNum/minNum); otherwise the builtin %s, which orders -0 below +0.", name, op)
		body = append(body,
			jen.If(jen.Id("a").Op("!=").Id("a")).Block(jen.Return(jen.Id("x"))),
			jen.If(jen.Id("x").Op("!=").Id("x")).Block(jen.Return(jen.Id("a"))))
	}
	body = append(body, jen.Return(jen.Id(op).Call(jen.Id("a"), jen.Id("x"))))
	f.Comment(commentText(doc))
	f.Func().Id(name).Params(jen.List(jen.Id("a"), jen.Id("x")).Add(acc)).Add(acc).Block(body...)
	f.Line()
}

// hostBody emits a switch on the source count: for k <= hostFused sources
//
//	s0, s1, ... := elems[T](srcs[0])[:len(d)], ...   // equal lengths: no bounds checks in the loop
//	for i := range d { d[i] = down(up(s0[i]) + up(s1[i]) + ...) }
//
// (max and min: maxF32(maxF32(up(s0[i]), up(s1[i])), ...)), the same
// left-to-right order as accumulating source by source, so the results are
// bitwise those of that definition; the accumulator lives in a register.
// More sources: per block of hostBlock elements, the first hostFused
// sources into acc, then 4 at a time, then one at a time, then dst.
func hostBody(ht hostType, op coll.Op) []jen.Code {
	up := func(v jen.Code) jen.Code {
		if ht.up == "" {
			return v
		}
		return jen.Qual(numericPkg, ht.up).Call(v)
	}
	down := func(v jen.Code) jen.Code {
		if ht.down == "" {
			return v
		}
		return jen.Qual(numericPkg, ht.down).Call(v)
	}
	comb := func(a, x jen.Code) *jen.Statement {
		if op == coll.Sum {
			return jen.Add(a).Op("+").Add(x)
		}
		return jen.Id(ht.helper(op)).Call(a, x)
	}
	// fold combines acc (nil: none) with up(name(j)[i]) for j < k.
	fold := func(acc jen.Code, name func(j int) string, k int) jen.Code {
		e := acc
		for j := 0; j < k; j++ {
			v := up(jen.Id(name(j)).Index(jen.Id("i")))
			if e == nil {
				e = v
			} else {
				e = comb(e, v)
			}
		}
		return e
	}
	// views declares name(j) := elems[T](src(j))[lo:hi][:len(d)] for j < k.
	views := func(name func(j int) string, k int, src func(j int) *jen.Statement, sub jen.Code, d string) []jen.Code {
		var out []jen.Code
		for j := 0; j < k; j++ {
			v := jen.Id("elems").Types(ht.elem).Call(src(j))
			if sub != nil {
				v = v.Add(sub)
			}
			out = append(out, jen.Id(name(j)).Op(":=").Add(v).Index(jen.Empty(), jen.Len(jen.Id(d))))
		}
		return out
	}
	sName := func(j int) string { return fmt.Sprintf("s%d", j) }
	tName := func(j int) string { return fmt.Sprintf("t%d", j) }
	srcK := func(j int) *jen.Statement { return jen.Id("srcs").Index(jen.Lit(j)) }
	rangeD := func(d string, body ...jen.Code) jen.Code {
		return jen.For(jen.Id("i").Op(":=").Range().Id(d)).Block(body...)
	}
	var cases []jen.Code
	for k := 1; k <= hostFused; k++ {
		if k == 1 && ht.up == "" {
			// copy(d, elems[T](srcs[0])[:len(d)]): one source of a type that
			// needs no conversion is a copy, bit for bit (f16 and bf16 go
			// through up and down, which quiet a signalling NaN).
			cases = append(cases, jen.Case(jen.Lit(1)).Block(
				jen.Copy(jen.Id("d"), jen.Id("elems").Types(ht.elem).Call(srcK(0)).Index(jen.Empty(), jen.Len(jen.Id("d"))))))
			continue
		}
		body := views(sName, k, srcK, nil, "d")
		body = append(body, rangeD("d", jen.Id("d").Index(jen.Id("i")).Op("=").Add(down(fold(nil, sName, k)))))
		cases = append(cases, jen.Case(jen.Lit(k)).Block(body...))
	}
	block := jen.Index(jen.Id("lo"), jen.Id("hi"))
	ai := jen.Id("a").Index(jen.Id("i"))
	def := []jen.Code{
		jen.Var().Id("acc").Index(jen.Id("hostBlock")).Add(ht.acc),
		jen.For(jen.Id("lo").Op(":=").Lit(0), jen.Id("lo").Op("<").Len(jen.Id("d")), jen.Id("lo").Op("+=").Id("hostBlock")).Block(append(append(
			[]jen.Code{
				jen.Id("hi").Op(":=").Min(jen.Id("lo").Op("+").Id("hostBlock"), jen.Len(jen.Id("d"))),
				jen.Id("a").Op(":=").Id("acc").Index(jen.Empty(), jen.Id("hi").Op("-").Id("lo")),
			},
			views(sName, hostFused, srcK, block, "a")...),
			rangeD("a", ai.Clone().Op("=").Add(fold(nil, sName, hostFused))),
			jen.Id("rest").Op(":=").Id("srcs").Index(jen.Lit(hostFused), jen.Empty()),
			jen.For(jen.Empty(), jen.Len(jen.Id("rest")).Op(">=").Lit(4), jen.Id("rest").Op("=").Id("rest").Index(jen.Lit(4), jen.Empty())).Block(append(
				views(tName, 4, func(j int) *jen.Statement { return jen.Id("rest").Index(jen.Lit(j)) }, block, "a"),
				rangeD("a", ai.Clone().Op("=").Add(fold(ai.Clone(), tName, 4))))...),
			jen.For(jen.List(jen.Id("_"), jen.Id("src")).Op(":=").Range().Id("rest")).Block(append(
				views(func(int) string { return "t" }, 1, func(int) *jen.Statement { return jen.Id("src") }, block, "a"),
				rangeD("a", ai.Clone().Op("=").Add(fold(ai.Clone(), func(int) string { return "t" }, 1))))...),
			jen.Id("dd").Op(":=").Id("d").Index(jen.Id("lo"), jen.Id("hi")).Index(jen.Empty(), jen.Len(jen.Id("a"))),
			rangeD("a", jen.Id("dd").Index(jen.Id("i")).Op("=").Add(down(ai.Clone()))),
		)...),
	}
	cases = append(cases, jen.Default().Block(def...))
	return []jen.Code{
		jen.Id("d").Op(":=").Id("elems").Types(ht.elem).Call(jen.Id("dst")),
		jen.Switch(jen.Len(jen.Id("srcs"))).Block(cases...),
	}
}

// sortedKeys returns m's keys in order, for deterministic output.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
