package goglue

import (
	"fmt"
	"strings"

	"github.com/dave/jennifer/jen"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/plan"
)

const numericPkg = "github.com/collgen/collgen/runtime/numeric"

// hostType is how a dtype is stored and accumulated by the host loops.
type hostType struct {
	elem   jen.Code // storage type
	acc    jen.Code // accumulator type
	up     string   // numeric function converting elem -> acc ("" = none)
	down   string   // numeric function converting acc -> elem
	goName string   // F32, BF16, ...
}

func hostTypeOf(dtype coll.DType) (hostType, error) {
	switch dtype {
	case coll.F32:
		return hostType{jen.Float32(), jen.Float32(), "", "", "F32"}, nil
	case coll.F64:
		return hostType{jen.Float64(), jen.Float64(), "", "", "F64"}, nil
	case coll.I32:
		return hostType{jen.Int32(), jen.Int32(), "", "", "I32"}, nil
	case coll.I64:
		return hostType{jen.Int64(), jen.Int64(), "", "", "I64"}, nil
	case coll.F16:
		return hostType{jen.Uint16(), jen.Float32(), "F16ToF32", "F32ToF16", "F16"}, nil
	case coll.BF16:
		return hostType{jen.Uint16(), jen.Float32(), "BF16ToF32", "F32ToBF16", "BF16"}, nil
	}
	return hostType{}, fmt.Errorf("dtype %s has no host reduce loop", dtype)
}

// hostFile emits one reduce loop per (dtype, op) of the host topology, e.g.
//
//	func reduceBF16Sum(dst []byte, srcs [][]byte) { ... accumulate in float32, round once ... }
//
// and the table hostReducers mapping kernels.HostKey to them.
func hostFile(p *plan.Plan) *jen.File {
	f := newFile(p, "")
	f.Comment(commentText("hostBlock is how many elements a host loop accumulates at a time: the accumulator stays in L1 while every source streams through once."))
	f.Const().Id("hostBlock").Op("=").Lit(1024)
	f.Line()
	// func elems[T any](b []byte, lo, m int) []T
	f.Comment(commentText("elems views m elements of type T of b, starting at element lo."))
	f.Func().Id("elems").Types(jen.Id("T").Any()).Params(jen.Id("b").Index().Byte(), jen.List(jen.Id("lo"), jen.Id("m")).Int()).Index().Id("T").Block(
		jen.Var().Id("z").Id("T"),
		jen.Id("size").Op(":=").Int().Call(jen.Qual("unsafe", "Sizeof").Call(jen.Id("z"))),
		jen.Return(jen.Qual("unsafe", "Slice").Call(jen.Parens(jen.Op("*").Id("T")).Call(jen.Qual("unsafe", "Pointer").Call(jen.Op("&").Id("b").Index(jen.Id("lo").Op("*").Id("size")))), jen.Id("m"))),
	)
	f.Line()
	var table []jen.Code
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
		f.Comment(commentText(fmt.Sprintf("%s is the host reduce loop for %s %s: dst = srcs[0] %s srcs[1] %s ..., in source order.", name, key.DType, key.Op, key.Op, key.Op)))
		f.Func().Id(name).Params(jen.Id("dst").Index().Byte(), jen.Id("srcs").Index().Index().Byte()).Block(hostBody(ht, key.Op, key.DType.IsFloat())...)
		f.Line()
	}
	f.Comment(commentText("hostReducers maps each host (dtype, op) to its reduce loop."))
	f.Var().Id("hostReducers").Op("=").Map(jen.Qual(kernelsPkg, "HostKey")).Qual(kernelsPkg, "HostReduceFunc").Custom(multi, table...)
	return f
}

// hostBody emits:
//
//	var z T; n := len(dst) / size; var acc [hostBlock]A
//	for lo := 0; lo < n; lo += hostBlock { m := min(hostBlock, n-lo); a := acc[:m]
//	    for i, v := range elems[T](srcs[0], lo, m) { a[i] = up(v) }
//	    for _, src := range srcs[1:] { s := elems[T](src, lo, m)[:len(a)]; for i, v := range s { a[i] = op(a[i], up(v)) } }
//	    d := elems[T](dst, lo, m)[:len(a)]; for i, v := range a { d[i] = down(v) } }
func hostBody(ht hostType, op coll.Op, float bool) []jen.Code {
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
	ai := jen.Id("a").Index(jen.Id("i"))
	var combine jen.Code
	switch op {
	case coll.Sum:
		combine = jen.Id("a").Index(jen.Id("i")).Op("+=").Add(up(jen.Id("v")))
	case coll.Max, coll.Min:
		// if x := up(v); x > a[i] || a[i] != a[i] || (zeros) { a[i] = x } (min: <).
		// Floats follow maxNum/minNum as the CUDA op and NCCL do: a NaN
		// operand is ignored unless every operand is NaN, so the result
		// does not depend on where the NaN sits (a NaN accumulator takes
		// the next value; a NaN value never replaces a number).
		cmp := ">"
		if op == coll.Min {
			cmp = "<"
		}
		cond := jen.Id("x").Op(cmp).Add(ai.Clone())
		if float {
			// ... || a[i] != a[i] || x == a[i] && math.Signbit(float64(a[i])) != math.Signbit(float64(x))
			// and x is the zero the op prefers: +0 for max, -0 for min, as
			// the GPUs order zeros (measured against NCCL, docs/numerics.md).
			signbit := func(v jen.Code) *jen.Statement { return jen.Qual("math", "Signbit").Call(jen.Float64().Call(v)) }
			prefer := signbit(jen.Id("x"))
			if op == coll.Max {
				prefer = jen.Op("!").Add(signbit(jen.Id("x")))
			}
			cond = cond.Op("||").Add(ai.Clone()).Op("!=").Add(ai.Clone()).
				Op("||").Id("x").Op("==").Add(ai.Clone()).Op("&&").Add(signbit(ai.Clone())).Op("!=").Add(signbit(jen.Id("x"))).Op("&&").Add(prefer)
		}
		combine = jen.If(jen.Id("x").Op(":=").Add(up(jen.Id("v"))), cond).Block(ai.Clone().Op("=").Id("x"))
	}
	view := func(b jen.Code) *jen.Statement {
		return jen.Id("elems").Types(ht.elem).Call(b, jen.Id("lo"), jen.Id("m"))
	}
	return []jen.Code{
		jen.Var().Id("z").Add(ht.elem),
		jen.Id("n").Op(":=").Len(jen.Id("dst")).Op("/").Int().Call(jen.Qual("unsafe", "Sizeof").Call(jen.Id("z"))),
		jen.Var().Id("acc").Index(jen.Id("hostBlock")).Add(ht.acc),
		jen.For(jen.Id("lo").Op(":=").Lit(0), jen.Id("lo").Op("<").Id("n"), jen.Id("lo").Op("+=").Id("hostBlock")).Block(
			jen.Id("m").Op(":=").Min(jen.Id("hostBlock"), jen.Id("n").Op("-").Id("lo")),
			jen.Id("a").Op(":=").Id("acc").Index(jen.Empty(), jen.Id("m")),
			jen.For(jen.List(jen.Id("i"), jen.Id("v")).Op(":=").Range().Add(view(jen.Id("srcs").Index(jen.Lit(0))))).Block(
				jen.Id("a").Index(jen.Id("i")).Op("=").Add(up(jen.Id("v"))),
			),
			jen.For(jen.List(jen.Id("_"), jen.Id("src")).Op(":=").Range().Id("srcs").Index(jen.Lit(1), jen.Empty())).Block(
				jen.Id("s").Op(":=").Add(view(jen.Id("src"))).Index(jen.Empty(), jen.Len(jen.Id("a"))),
				jen.For(jen.List(jen.Id("i"), jen.Id("v")).Op(":=").Range().Id("s")).Block(combine),
			),
			jen.Id("d").Op(":=").Add(view(jen.Id("dst"))).Index(jen.Empty(), jen.Len(jen.Id("a"))),
			jen.For(jen.List(jen.Id("i"), jen.Id("v")).Op(":=").Range().Id("a")).Block(
				jen.Id("d").Index(jen.Id("i")).Op("=").Add(down(jen.Id("v"))),
			),
		),
	}
}
