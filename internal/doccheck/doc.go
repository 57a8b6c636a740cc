// Package doccheck holds no code: its test enforces the project's rule
// that every exported name has a doc comment (DEVELOPERS.md, "Comments"
// in the style notes). It lives in a package of its own because the rule
// spans the whole module: the test parses every package's non-test files
// from the module root, whatever their build tags, so a name declared only
// in a cgo or linux file is checked too.
package doccheck
