package tune

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/spec"
)

// ReplaceSelect returns a copy of the spec file data in which topology's
// `select:` rules for the collectives in rules are replaced (other
// collectives' rules, and everything else in the file, stay; comments
// outside the replaced lists are kept). The rules use the list form: one
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
	for _, c := range coll.Collectives() {
		seq, ok := rules[c]
		if !ok {
			continue
		}
		if old := lookup(sel, string(c)); old != nil {
			*old = *seq
		} else {
			sel.Content = append(sel.Content, scalar(string(c)), seq)
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
	if _, err := spec.Parse(name, b.Bytes()); err != nil {
		return nil, fmt.Errorf("the spec with the new rules does not load:\n%w", err)
	}
	return b.Bytes(), nil
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
