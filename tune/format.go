package tune

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/collgen/collgen/spec"
)

// WriteDecisions writes, per table, what was picked at each measured size:
// latency, the fastest and NCCL, how the pick came about, and "close" where
// another run may move the crossover.
func WriteDecisions(w io.Writer, tables []Table) error {
	for k, t := range tables {
		if k > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s, world size %d:\n", t.Collective, t.World)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  size\tpick\tus\tfastest\tus\tnccl us\thow\t")
		for _, d := range t.Decisions {
			nccl := "-"
			if d.NCCLUS > 0 {
				nccl = strconv.FormatFloat(d.NCCLUS, 'f', 2, 64)
			}
			how := d.How
			if d.Close {
				how += " (close)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%.2f\t%s\t%.2f\t%s\t%s\t\n", spec.FormatSize(d.Bytes), d.Pick, d.PickUS, d.Fastest, d.FastestUS, nccl, how)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// RulesYAML renders rules as YAML flow mappings, one a line, each line
// starting with indent.
func RulesYAML(indent string, rules []spec.Rule) string {
	var b strings.Builder
	for _, r := range rules {
		sym := ""
		if r.Symmetric {
			sym = ", symmetric: true"
		}
		if r.UpTo == 0 {
			fmt.Fprintf(&b, "%s- {use: %s%s}\n", indent, r.Use, sym)
		} else {
			fmt.Fprintf(&b, "%s- {upto: %s, use: %s%s}\n", indent, spec.FormatSize(r.UpTo), r.Use, sym)
		}
	}
	return b.String()
}

// PerWorldYAML renders one collective's per-world rules as a mapping from
// world sizes to rule lists, one key per run of consecutive world sizes
// with equal rules ("3-4:"), each line starting with indent.
func PerWorldYAML(indent string, byWorld map[int][]spec.Rule) string {
	var b strings.Builder
	ws := slices.Sorted(maps.Keys(byWorld))
	for i := 0; i < len(ws); {
		j := i
		for j+1 < len(ws) && ws[j+1] == ws[j]+1 && slices.Equal(byWorld[ws[j+1]], byWorld[ws[i]]) {
			j++
		}
		if j > i {
			fmt.Fprintf(&b, "%s%d-%d:\n", indent, ws[i], ws[j])
		} else {
			fmt.Fprintf(&b, "%s%d:\n", indent, ws[i])
		}
		b.WriteString(RulesYAML(indent+"  ", byWorld[ws[i]]))
		i = j + 1
	}
	return b.String()
}

// SelectYAML renders tables as a `select:` block in the per-world-size
// syntax of docs/spec.md: under each collective, a mapping
// from world size to its rule list. indent prefixes every line (the
// `select:` key included).
func SelectYAML(indent string, tables []Table) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%sselect:\n", indent)
	last := ""
	for _, t := range tables {
		if t.Collective != last {
			fmt.Fprintf(&b, "%s  %s:\n", indent, t.Collective)
			last = t.Collective
		}
		fmt.Fprintf(&b, "%s    %d:\n", indent, t.World)
		b.WriteString(RulesYAML(indent+"      ", t.Rules))
	}
	return b.String()
}

// SelectYAMLFor renders the tables of one world size as a `select:` block
// in today's syntax (one rule list per collective, for every world size of
// the topology).
func SelectYAMLFor(indent string, tables []Table, world int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%sselect:\n", indent)
	for _, t := range tables {
		if t.World != world {
			continue
		}
		fmt.Fprintf(&b, "%s  %s:\n", indent, t.Collective)
		b.WriteString(RulesYAML(indent+"    ", t.Rules))
	}
	return b.String()
}

// CloseCalls lists the close calls of the tables, one entry per table that
// has any: "allgather w4 at 16MiB, 32MiB".
func CloseCalls(tables []Table) []string {
	var out []string
	for _, t := range tables {
		var sizes []string
		for _, d := range t.Decisions {
			if d.Close {
				sizes = append(sizes, spec.FormatSize(d.Bytes))
			}
		}
		if len(sizes) > 0 {
			out = append(out, fmt.Sprintf("%s w%d at %s", t.Collective, t.World, strings.Join(sizes, ", ")))
		}
	}
	return out
}
