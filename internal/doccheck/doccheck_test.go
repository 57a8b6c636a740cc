package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestExportedNamesDocumented fails naming every exported name of the
// module's hand-written packages that has no doc comment: types,
// functions, constants, variables, methods of exported types, and the
// exported fields and interface methods of exported types; and every
// package without a package comment.
func TestExportedNamesDocumented(t *testing.T) {
	root := moduleRoot(t)
	missing := undocumented(t, root, func(f *ast.File) bool { return !ast.IsGenerated(f) })
	for _, m := range missing {
		t.Error("no doc comment: " + m)
	}
	if len(missing) > 0 {
		t.Log("add a comment that says what a reader cannot see in the name: units, what the zero value means, who owns or frees it")
	}
}

// TestGeneratedGlueDocumented holds the generated Go glue to the same
// rule: it is what a user of a generated package reads in go doc, and its
// comments come from the emitters in templates/go.
func TestGeneratedGlueDocumented(t *testing.T) {
	root := filepath.Join(moduleRoot(t), "generated", "collectives")
	for _, m := range undocumented(t, root, ast.IsGenerated) {
		t.Error("no doc comment (fix templates/go, then collgen generate): generated/collectives/" + m)
	}
}

// moduleRoot walks up from the test's directory to the go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// undocumented parses the non-test Go files under root that keep selects
// (all build tags: go/parser ignores constraints, so cgo-only and
// linux-only names are checked too), skipping testdata and hidden
// directories, and returns "path:line: kind Name" for each exported name
// without a doc comment, and "dir: package name" for each package none of
// whose files has a package comment, sorted.
func undocumented(t *testing.T, root string, keep func(*ast.File) bool) []string {
	t.Helper()
	var missing []string
	fset := token.NewFileSet()
	pkgDoc := map[string]bool{}    // directory -> some kept file has a package comment
	pkgName := map[string]string{} // directory -> package name
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if !keep(f) {
			return nil
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		pkgName[dir] = f.Name.Name
		pkgDoc[dir] = pkgDoc[dir] || documented(f.Doc)
		c := checker{fset: fset, report: func(pos token.Pos, kind, name string) {
			p := fset.Position(pos)
			rel, _ := filepath.Rel(root, p.Filename)
			missing = append(missing, fmt.Sprintf("%s:%d: %s %s", filepath.ToSlash(rel), p.Line, kind, name))
		}}
		c.file(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, ok := range pkgDoc {
		if !ok {
			missing = append(missing, fmt.Sprintf("%s: package %s", filepath.ToSlash(dir), pkgName[dir]))
		}
	}
	sort.Strings(missing)
	return missing
}

// checker reports the exported names of a file that have no doc comment.
type checker struct {
	fset   *token.FileSet
	report func(pos token.Pos, kind, name string)
}

// documented reports whether any of the comments (a doc comment above, a
// comment at the end of the line: go doc shows both) has text.
func documented(groups ...*ast.CommentGroup) bool {
	for _, g := range groups {
		if g != nil && strings.TrimSpace(g.Text()) != "" {
			return true
		}
	}
	return false
}

// file checks f's top-level declarations: functions, methods whose
// receiver type is exported, types, constants and variables. A constant
// or variable of a parenthesised group is documented by the group's
// comment too (the constants of an enum share one, as go doc shows them).
func (c checker) file(f *ast.File) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || documented(d.Doc) {
				continue
			}
			if d.Recv == nil {
				c.report(d.Pos(), "func", d.Name.Name)
			} else if recv := receiverType(d.Recv.List[0].Type); ast.IsExported(recv) {
				c.report(d.Pos(), "method", recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			lone := !d.Lparen.IsValid() // a lone declaration's comment sits on the GenDecl
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					if !documented(s.Doc, s.Comment) && !(lone && documented(d.Doc)) {
						c.report(s.Pos(), "type", s.Name.Name)
					}
					c.typeExpr(s.Name.Name, s.Type)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() && !documented(s.Doc, s.Comment, d.Doc) {
							c.report(n.Pos(), d.Tok.String(), n.Name)
						}
					}
				}
			}
		}
	}
}

// typeExpr checks the exported fields and interface methods of an
// exported type's definition (nested struct types too), named owner.X.
//
// A field without a comment of its own is documented by the doc comment
// of the field just before it when that comment names it and no blank
// line parts them: "// LatencyUS is the median ...; MinUS and MaxUS the
// fastest and slowest" above LatencyUS, MinUS and MaxUS.
func (c checker) typeExpr(owner string, typ ast.Expr) {
	switch t := typ.(type) {
	case *ast.StructType:
		run, runEnd := "", 0 // the field group's doc comment, and the line its last field ends on
		for _, field := range t.Fields.List {
			start := c.fset.Position(field.Pos()).Line
			if field.Doc != nil {
				start = c.fset.Position(field.Doc.Pos()).Line
			}
			if start > runEnd+1 {
				run = ""
			}
			if documented(field.Doc) {
				run = field.Doc.Text()
			}
			runEnd = c.fset.Position(field.End()).Line
			names := field.Names
			if len(names) == 0 { // embedded: the field is named after its type
				if n := embeddedName(field.Type); n != nil {
					names = []*ast.Ident{n}
				}
			}
			for _, n := range names {
				if !n.IsExported() {
					continue
				}
				if !documented(field.Doc, field.Comment) && !mentions(run, n.Name) {
					c.report(n.Pos(), "field", owner+"."+n.Name)
				}
				c.typeExpr(owner+"."+n.Name, field.Type)
			}
		}
	case *ast.InterfaceType:
		for _, m := range t.Methods.List {
			for _, n := range m.Names {
				if n.IsExported() && !documented(m.Doc, m.Comment) {
					c.report(n.Pos(), "method", owner+"."+n.Name)
				}
			}
		}
	case *ast.StarExpr:
		c.typeExpr(owner, t.X)
	case *ast.ArrayType:
		c.typeExpr(owner, t.Elt)
	case *ast.MapType:
		c.typeExpr(owner, t.Value)
	}
}

// mentions reports whether text names name as a whole word.
func mentions(text, name string) bool {
	return text != "" && regexp.MustCompile(`\b`+regexp.QuoteMeta(name)+`\b`).MatchString(text)
}

// receiverType is the name of a method's receiver type, without pointer
// or type parameters.
func receiverType(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.ParenExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

// embeddedName is the identifier an embedded field is named by.
func embeddedName(e ast.Expr) *ast.Ident {
	switch t := e.(type) {
	case *ast.Ident:
		return t
	case *ast.StarExpr:
		return embeddedName(t.X)
	case *ast.SelectorExpr:
		return t.Sel
	case *ast.IndexExpr:
		return embeddedName(t.X)
	case *ast.IndexListExpr:
		return embeddedName(t.X)
	}
	return nil
}

// TestCheckerReports pins what counts as documented on a small file.
func TestCheckerReports(t *testing.T) {
	const src = `package p

// A is documented.
type A struct {
	// X is documented above.
	X int
	Y int // Y is documented at the end of its line.
	Z int

	// P is the first; Q the second.
	P, Q int
	R    int

	// S names T below it.
	S int

	T int
	u int
	N struct{ M int }
}

type B interface{ Do() }

type c struct{ V int }

func (A) F()  {}
func (c) G()  {}
func H()      {}

// Enums share the group's comment.
const (
	K1 = 1
	K2 = 2
)

var V1, v2 int
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	c := checker{fset: fset, report: func(_ token.Pos, kind, name string) { got = append(got, kind+" "+name) }}
	c.file(f)
	want := []string{"field A.Z", "field A.R", "field A.T", "field A.N", "field A.N.M", "type B", "method B.Do", "method A.F", "func H", "var V1"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("reported %q, want %q", got, want)
	}
}
