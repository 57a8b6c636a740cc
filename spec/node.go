package spec

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// loader collects errors while it walks one file's YAML nodes.
type loader struct {
	file string
	errs ErrorList
	// walks counts mapping walks, merges included (tests bound it).
	walks int
}

// errorf records an error at n's position (1:1 if n is nil).
func (l *loader) errorf(n *yaml.Node, format string, args ...any) {
	line, col := 1, 1
	if n != nil && n.Line > 0 {
		line, col = n.Line, n.Column
	}
	l.errs = append(l.errs, &Error{File: l.file, Line: line, Col: col, Msg: fmt.Sprintf(format, args...)})
}

// field is one key: value pair of a mapping.
type field struct {
	name     string
	key, val *yaml.Node
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 64; i++ {
		if n.Alias == nil {
			return n
		}
		n = n.Alias
	}
	return n
}

// isNull reports whether n is absent or an explicit null (`key:` with no
// value, `~` or `null`), which the spec treats like an absent key.
func isNull(n *yaml.Node) bool {
	n = resolve(n)
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// describe names what n is, for type errors: `a list`, `the string "x"`.
func describe(n *yaml.Node) string {
	n = resolve(n)
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:37] + "..."
		}
		switch n.Tag {
		case "!!null":
			return "null"
		case "!!int":
			return "the integer " + v
		case "!!float":
			return "the number " + v
		case "!!bool":
			return "the boolean " + v
		case "!!str":
			return fmt.Sprintf("the string %q", v)
		}
		return fmt.Sprintf("%q", v)
	case yaml.AliasNode:
		return "an alias"
	}
	return "something else"
}

// mappingOf checks that n is a mapping (null counts as an empty one) and
// returns its pairs in file order, reporting duplicate keys and keys that are
// not plain names. Merge keys (<<: *base) add the fields of the mappings they
// name that n does not set itself. what names n in messages; example shows
// what to write.
func (l *loader) mappingOf(n *yaml.Node, what, example string) []field {
	return l.mappingDepth(n, what, example, 0, map[*yaml.Node]bool{})
}

// maxMergeDepth bounds merges of merges.
const maxMergeDepth = 8

// mappingDepth is mappingOf within depth merges. merged holds the mappings
// already merged into this one: merging one again adds no field (the first
// merge's fields win), and walking it again for every alias made a spec
// of under a kilobyte (7 levels of 20 aliases) take exponential time.
func (l *loader) mappingDepth(n *yaml.Node, what, example string, depth int, merged map[*yaml.Node]bool) []field {
	l.walks++
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "%s must be a mapping, not %s; write %s", what, describe(n), example)
		return nil
	}
	var out []field
	var merges []*yaml.Node
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		rk := resolve(k)
		if rk == nil || rk.Kind != yaml.ScalarNode {
			l.errorf(k, "keys in %s must be plain names, not %s", what, describe(k))
			continue
		}
		if rk.Tag == "!!merge" {
			merges = append(merges, v)
			continue
		}
		if first, dup := seen[rk.Value]; dup {
			l.errorf(k, "duplicate key %q in %s (first at line %d:%d); keep one of them", rk.Value, what, first.Line, first.Column)
			continue
		}
		seen[rk.Value] = k
		out = append(out, field{name: rk.Value, key: k, val: v})
	}
	for _, m := range merges {
		srcs := []*yaml.Node{m}
		if r := resolve(m); r != nil && r.Kind == yaml.SequenceNode {
			srcs = r.Content
		}
		for _, src := range srcs {
			r := resolve(src)
			if r == nil || r.Kind != yaml.MappingNode {
				l.errorf(src, "a merge (<<) in %s must name a mapping, not %s; write <<: *name where &name marks a mapping", what, describe(src))
				continue
			}
			if merged[r] {
				continue
			}
			merged[r] = true
			if depth >= maxMergeDepth {
				l.errorf(src, "merges (<<) in %s nest more than %d deep; write the fields out", what, maxMergeDepth)
				continue
			}
			for _, f := range l.mappingDepth(src, what, example, depth+1, merged) {
				if _, ok := seen[f.name]; !ok {
					seen[f.name] = f.key
					out = append(out, f)
				}
			}
		}
	}
	return out
}

// fields reads a mapping with a fixed set of field names, reporting unknown
// fields with a suggestion. It returns the fields present, by name; an
// unknown field that looks like a typo of a known one is also recorded under
// "?"+known, so that checks for missing fields can stay quiet about it.
func (l *loader) fields(n *yaml.Node, what, example string, known []string) map[string]field {
	out := map[string]field{}
	for _, f := range l.mappingOf(n, what, example) {
		if what == "the spec" && strings.HasPrefix(f.name, "x-") {
			continue // extension fields: a place for anchors
		}
		if !slices.Contains(known, f.name) {
			hint := didYouMean(f.name, known)
			if sg := suggest(f.name, known); sg != "" {
				out["?"+sg] = f
			}
			if hint == "" {
				hint = "; known fields: " + strings.Join(known, ", ")
				if what == "the spec" {
					hint += " (fields named x-... are ignored: a place for anchors)"
				}
			}
			l.errorf(f.key, "unknown field %q %s%s", f.name, inWhat(what), hint)
			continue
		}
		out[f.name] = f
	}
	return out
}

// inWhat turns a description into a prepositional phrase: "the top level"
// -> "at the top level", others -> "in ...".
func inWhat(what string) string {
	if what == "the spec" {
		return "at the top level"
	}
	return "in " + what
}

// seqOf checks that n is a list (null counts as empty) and returns its items.
func (l *loader) seqOf(n *yaml.Node, what, example string) []*yaml.Node {
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		l.errorf(n, "%s must be a list, not %s; write %s", what, describe(n), example)
		return nil
	}
	return n.Content
}

// name reads a scalar name (a string).
func (l *loader) name(n *yaml.Node, what, example string) (string, bool) {
	r := resolve(n)
	if r == nil || r.Kind != yaml.ScalarNode || r.Tag != "!!str" {
		l.errorf(n, "%s must be a name, not %s; write %s", what, describe(n), example)
		return "", false
	}
	return r.Value, true
}

// integer reads an integer scalar.
func (l *loader) integer(n *yaml.Node, what, example string) (int64, bool) {
	r := resolve(n)
	if r == nil || r.Kind != yaml.ScalarNode || r.Tag != "!!int" {
		l.errorf(n, "%s must be an integer, not %s; write %s", what, describe(n), example)
		return 0, false
	}
	var v int64
	if err := r.Decode(&v); err != nil {
		l.errorf(n, "%s %s is out of range; write %s", what, r.Value, example)
		return 0, false
	}
	return v, true
}

// number reads a finite number (integer or float scalar).
func (l *loader) number(n *yaml.Node, what, example string) (float64, bool) {
	r := resolve(n)
	if r == nil || r.Kind != yaml.ScalarNode || (r.Tag != "!!int" && r.Tag != "!!float") {
		l.errorf(n, "%s must be a number, not %s; write %s", what, describe(n), example)
		return 0, false
	}
	var v float64
	if err := r.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		l.errorf(n, "%s must be a finite number, not %s; write %s", what, r.Value, example)
		return 0, false
	}
	return v, true
}

// reportMissing reports whether a missing field should be reported: not
// when an unknown field in the same mapping looks like a typo of it (that
// error already says what to write).
func reportMissing(f map[string]field, name string) bool {
	_, typo := f["?"+name]
	return !typo
}
