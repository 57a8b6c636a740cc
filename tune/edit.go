package tune

import (
	"bytes"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/spec"
)

// ReplaceSelect returns a copy of the spec file data in which topology's
// `select:` rules for the collectives in rules are replaced (other
// collectives' rules, and everything else in the file, stay: byte for byte
// where select is a block mapping, else re-encoded with comments kept;
// aliases of replaced rules elsewhere become copies of them). The rules use the list form: one
// list per collective, for every world size of the topology. note, if not
// empty, becomes a comment on the `select:` key. The result is checked with
// spec.Parse under name before it is returned.
func ReplaceSelect(name string, data []byte, topology string, rules map[coll.Collective][]spec.Rule, note string) ([]byte, error) {
	nodes := map[coll.Collective]*yaml.Node{}
	for c, rs := range rules {
		nodes[c] = rulesNode(rs)
	}
	return replaceSelect(name, data, topology, nodes, note)
}

// ReplaceSelectPerWorld is ReplaceSelect with the per-world form: each
// collective in rules maps world sizes to their rules, written as a mapping
// whose keys are world sizes, or "lo-hi" ranges of consecutive sizes with
// equal rules. World sizes absent from a collective's map are left out (on
// a GPU topology they use NCCL).
func ReplaceSelectPerWorld(name string, data []byte, topology string, rules map[coll.Collective]map[int][]spec.Rule, note string) ([]byte, error) {
	nodes := map[coll.Collective]*yaml.Node{}
	for c, byWorld := range rules {
		ws := slices.Sorted(maps.Keys(byWorld))
		m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for i := 0; i < len(ws); {
			j := i
			for j+1 < len(ws) && ws[j+1] == ws[j]+1 && slices.Equal(byWorld[ws[j+1]], byWorld[ws[i]]) {
				j++
			}
			key := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(ws[i])}
			if j > i {
				key = scalar(fmt.Sprintf("%d-%d", ws[i], ws[j]))
			}
			m.Content = append(m.Content, key, rulesNode(byWorld[ws[i]]))
			i = j + 1
		}
		nodes[c] = m
	}
	return replaceSelect(name, data, topology, nodes, note)
}

// KeepSymmetric returns measured (plain rules from a sweep of staged
// inputs) with the symmetric rules of old (the rules it replaces) put back
// before measured's last rule: tuning staged inputs says nothing about
// inputs read in place. A bounded symmetric rule is kept only when its
// bound lies above every bounded measured rule's (the bounds must grow).
func KeepSymmetric(measured, old []spec.Rule) []spec.Rule {
	if len(measured) == 0 {
		return measured
	}
	last := measured[len(measured)-1]
	out := slices.Clone(measured[:len(measured)-1])
	top := int64(0)
	for _, r := range out {
		top = max(top, r.UpTo)
	}
	if last.UpTo != 0 {
		out, top = append(out, last), max(top, last.UpTo)
	}
	for _, r := range old {
		if r.Symmetric && (r.UpTo == 0 || r.UpTo > top) {
			out = append(out, r)
			if r.UpTo == 0 {
				break
			}
			top = r.UpTo
		}
	}
	if last.UpTo == 0 {
		out = append(out, last)
	}
	return out
}

// rulesNode is a rule list in flow-style mappings.
func rulesNode(rs []spec.Rule) *yaml.Node {
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, r := range rs {
		m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Style: yaml.FlowStyle}
		if r.UpTo != 0 {
			m.Content = append(m.Content, scalar("upto"), scalar(spec.FormatSize(r.UpTo)))
		}
		m.Content = append(m.Content, scalar("use"), scalar(string(r.Use)))
		if r.Symmetric {
			m.Content = append(m.Content, scalar("symmetric"), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
		}
		seq.Content = append(seq.Content, m)
	}
	return seq
}

// replaceSelect puts each collective's node under the topology's select.
func replaceSelect(name string, data []byte, topology string, rules map[coll.Collective]*yaml.Node, note string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a spec (want a YAML mapping)", name)
	}
	tops := lookup(doc.Content[0], "topologies")
	if tops == nil || tops.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: no topologies mapping", name)
	}
	top := lookup(tops, topology)
	if top == nil || top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: no topology %q", name, topology)
	}
	sel := lookup(top, "select")
	switch {
	case sel != nil && sel.Kind == yaml.AliasNode && sel.Alias != nil && sel.Alias.Kind == yaml.MappingNode:
		// `select: *rules`: the topology gets its own copy to edit (the
		// anchored mapping, and every other alias of it, keep theirs).
		*sel = *ownCopy(sel.Alias)
	case sel == nil:
		// A select merged in (`<<: *other`): this topology's own select
		// must keep the merged collectives, since it overrides the merge.
		if m := merged(top, "select"); m != nil && m.Kind == yaml.MappingNode {
			sel = ownCopy(m)
			top.Content = append(top.Content, scalar("select"), sel)
		}
	}
	var selKey *yaml.Node // the `select` key when its value is a block mapping in the file
	if sel != nil && sel.Kind == yaml.MappingNode && sel.Style&yaml.FlowStyle == 0 {
		for i := 0; i+1 < len(top.Content); i += 2 {
			if top.Content[i+1] == sel && sel.Line > top.Content[i].Line {
				selKey = top.Content[i]
			}
		}
	}
	if sel == nil || sel.Kind != yaml.MappingNode {
		if sel != nil {
			// `select:` with an empty value: replace the null by a mapping.
			*sel = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		} else {
			sel = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			top.Content = append(top.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "select"}, sel)
		}
	}
	if note != "" {
		for i := 0; i+1 < len(top.Content); i += 2 {
			if top.Content[i+1] == sel {
				top.Content[i].LineComment = note
			}
		}
	}
	type pair struct{ key, val *yaml.Node }
	var replaced []pair // the collectives whose rules were in the file, with their new rules
	added := false      // a collective had no rules in the file
	for _, c := range coll.Collectives() {
		seq, ok := rules[c]
		if !ok {
			continue
		}
		if i := slices.IndexFunc(sel.Content, func(n *yaml.Node) bool { return n.Value == string(c) }); i >= 0 && i%2 == 0 && i+1 < len(sel.Content) {
			if old := sel.Content[i+1]; old.Anchor != "" {
				unalias(&doc, old) // aliases elsewhere keep the old rules
			}
			*sel.Content[i+1] = *seq
			replaced = append(replaced, pair{sel.Content[i], sel.Content[i+1]})
		} else {
			sel.Content = append(sel.Content, scalar(string(c)), seq)
			added = true
		}
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	want, err := spec.Parse(name, b.Bytes())
	if err != nil {
		return nil, fmt.Errorf("the spec with the new rules does not load:\n%w", err)
	}
	// Where the file's select is a block mapping, rewrite its lines only:
	// best just the replaced collectives' entries (and the key's note),
	// else the whole select; each kept only if it loads as want.
	if selKey != nil {
		lines := bytes.SplitAfter(data, []byte("\n"))
		if !added {
			var edits []edit
			if note != "" {
				edits = append(edits, edit{selKey.Line - 1, selKey.Line - 1,
					fmt.Appendf(nil, "%s%s: # %s\n", strings.Repeat(" ", selKey.Column-1), selKey.Value, note)})
			}
			for _, p := range replaced {
				edits = append(edits, blockEdit(lines, p.key, p.val))
			}
			if out, ok := splice(name, lines, edits, want); ok {
				return out, nil
			}
		}
		if out, ok := splice(name, lines, []edit{blockEdit(lines, selKey, sel)}, want); ok {
			return out, nil
		}
	}
	return b.Bytes(), nil
}

// edit replaces lines first..last (0-based, inclusive) of a file.
type edit struct {
	first, last int
	text        []byte
}

// blockEdit replaces key's entry in a block mapping (its line and every
// following line indented deeper than it; trailing blank and comment
// lines are left to what follows) by the encoding of key: val at key's
// indentation. key's head comment stays where it is in the file. text is
// nil where key's position is unusable (splice then refuses the edit).
func blockEdit(lines [][]byte, key, val *yaml.Node) edit {
	first, indent := key.Line-1, key.Column-1
	if first < 0 || first >= len(lines) || indent < 0 {
		return edit{}
	}
	last := first
	for i := first + 1; i < len(lines); i++ {
		t := bytes.TrimLeft(lines[i], " ")
		if len(bytes.TrimSpace(t)) == 0 || t[0] == '#' {
			continue
		}
		if len(lines[i])-len(t) <= indent {
			break
		}
		last = i
	}
	k := *key
	k.HeadComment, k.FootComment = "", ""
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if enc.Encode(&yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{&k, val}}) != nil || enc.Close() != nil {
		return edit{}
	}
	pad := strings.Repeat(" ", indent)
	var text []byte
	for _, l := range bytes.SplitAfter(b.Bytes(), []byte("\n")) {
		if len(l) > 0 {
			text = append(append(text, pad...), l...)
		}
	}
	return edit{first, last, text}
}

// splice applies edits (in any order, not overlapping) to the file's
// lines. ok is false where an edit is unusable, edits overlap, or the
// result does not load as exactly the spec want (say, an anchor defined in
// a replaced entry and used elsewhere), so that the rest of the file keeps
// its blank lines, comment alignment and anchors byte for byte whenever
// ok is true.
func splice(name string, lines [][]byte, edits []edit, want *spec.Spec) (out []byte, ok bool) {
	edits = slices.Clone(edits)
	slices.SortFunc(edits, func(a, b edit) int { return a.first - b.first })
	var o bytes.Buffer
	next := 0
	for _, e := range edits {
		if e.text == nil || e.first < next || e.last < e.first {
			return nil, false
		}
		for _, l := range lines[next:e.first] {
			o.Write(l)
		}
		o.Write(e.text)
		next = e.last + 1
	}
	for _, l := range lines[next:] {
		o.Write(l)
	}
	got, err := spec.Parse(name, o.Bytes())
	if err != nil {
		return nil, false
	}
	a, w := *got, *want
	a.Sources, w.Sources = nil, nil
	if !reflect.DeepEqual(a, w) {
		return nil, false
	}
	return o.Bytes(), true
}

// unalias replaces every alias of anchored under n by a copy of anchored
// without its anchor, so that anchored can be overwritten while what
// aliased it keeps its value.
func unalias(n, anchored *yaml.Node) {
	for i, c := range n.Content {
		if c.Kind == yaml.AliasNode && c.Alias == anchored {
			cp := *anchored
			cp.Anchor = ""
			cp.HeadComment, cp.LineComment, cp.FootComment = c.HeadComment, c.LineComment, c.FootComment
			n.Content[i] = &cp
			continue
		}
		unalias(c, anchored)
	}
}

// merged returns the value of key that mapping m gets through its merge
// keys (`<<: *a` or `<<: [*a, *b]`, the first source holding key winning,
// as YAML merges), or nil.
func merged(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if k := m.Content[i]; k.Kind != yaml.ScalarNode || k.Value != "<<" || k.Tag != "!!merge" && k.Style != 0 {
			continue
		}
		srcs := []*yaml.Node{m.Content[i+1]}
		if v := m.Content[i+1]; v.Kind == yaml.SequenceNode {
			srcs = v.Content
		}
		for _, src := range srcs {
			if src.Kind == yaml.AliasNode {
				src = src.Alias
			}
			if src == nil || src.Kind != yaml.MappingNode {
				continue
			}
			if v := lookup(src, key); v != nil {
				if v.Kind == yaml.AliasNode {
					v = v.Alias
				}
				return v
			}
			if v := merged(src, key); v != nil {
				return v
			}
		}
	}
	return nil
}

// ownCopy is a deep copy of n without anchors (aliases in it stay aliases
// of the anchors they name), which can be changed without changing n.
func ownCopy(n *yaml.Node) *yaml.Node {
	cp := *n
	cp.Anchor = ""
	if n.Kind == yaml.AliasNode {
		return &cp
	}
	cp.Content = make([]*yaml.Node, len(n.Content))
	for i, c := range n.Content {
		cp.Content[i] = ownCopy(c)
	}
	return &cp
}

// lookup returns the value of key in mapping m, or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// scalar is a plain string scalar node.
func scalar(v string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v}
}

// PerWorldRules returns, for each collective tuned in tables at a world size
// of top, the rules of every world size of top: the tuned rules where
// measured, else the rules top selects today (SelectByWorld; absent where
// it has none, so a GPU world size then uses NCCL).
func PerWorldRules(top *spec.Topology, tables []Table) map[coll.Collective]map[int][]spec.Rule {
	out := map[coll.Collective]map[int][]spec.Rule{}
	for _, t := range tables {
		if !slices.Contains(top.WorldSizes, t.World) {
			continue
		}
		c := coll.Collective(t.Collective)
		if out[c] == nil {
			out[c] = map[int][]spec.Rule{}
		}
		out[c][t.World] = KeepSymmetric(t.Rules, top.SelectByWorld[c][t.World])
	}
	for c, byWorld := range out {
		for _, w := range top.WorldSizes {
			if _, ok := byWorld[w]; ok {
				continue
			}
			if rs, ok := top.SelectByWorld[c][w]; ok {
				byWorld[w] = rs
			}
		}
	}
	return out
}
