package spec

import (
	"cmp"
	"errors"
	"fmt"
	"go/token"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/schedule"
	"gopkg.in/yaml.v3"
)

// Field names, in documentation order.
var (
	topFields       = []string{"version", "package", "dtypes", "ops", "op_programs", "algorithms", "topologies", "multi_host"}
	multiHostFields = []string{"select"}
	dtypeFields     = []string{"reduce", "copy"}
	launchFields    = []string{"threads", "max_blocks", "vector_bytes", "min_threads"}
	topologyFields  = []string{"kind", "world_sizes", "link", "dtypes", "generate", "select"}
	linkFields      = []string{"bandwidth_gbps", "latency_us"}
	ruleFields      = []string{"upto", "use", "symmetric"}
)

// maxWorld bounds world sizes of topologies whose kind is unknown, so that a
// bad range cannot make the loader expand billions of sizes.
const maxWorld = 4096

// topoSrc is a topology with the nodes later checks point at.
type topoSrc struct {
	t        *Topology
	key      *yaml.Node                       // the topology's name
	kindOK   bool                             // Kind is valid
	genKey   map[coll.Collective]*yaml.Node   // generate.<c> keys
	genItems map[coll.Collective][]*yaml.Node // generate.<c> items, parallel to t.Generate[c]
	selKey   map[coll.Collective]*yaml.Node   // select.<c> keys
	rules    map[coll.Collective][]ruleSrc    // select.<c> rules as written (list form)
	perWorld map[coll.Collective][]worldRules // select.<c> per world size, in file order
	selOrder []coll.Collective                // select keys in file order
}

// worldRules is one key of a per-world select entry with its rules.
type worldRules struct {
	key   *yaml.Node
	text  string // the key as written: "4" or "3-4"
	sizes []int  // the world sizes the key names that are in world_sizes
	rules []ruleSrc
}

// ruleSrc is one select rule as written.
type ruleSrc struct {
	node    *yaml.Node
	upto    int64 // 0 if omitted
	hasUpto bool
	uptoN   *yaml.Node
	use     coll.Algorithm
	useN    *yaml.Node
	ok      bool // use was read
	sym     bool // symmetric: true
	symN    *yaml.Node
}

// spec reads the top-level mapping.
func (l *loader) spec(root *yaml.Node) *Spec {
	s := &Spec{}
	f := l.fields(root, "the spec", "version: 1", topFields)

	if v, ok := f["version"]; ok && !isNull(v.val) {
		if n, ok := l.integer(v.val, "version", "version: 1"); ok {
			if n != Version {
				l.errorf(v.val, "unsupported version %d; write version: %d (the only version this collgen reads)", n, Version)
			}
			s.Version = Version
		}
	} else if reportMissing(f, "version") {
		l.errorf(keyOr(v.key, root), "missing version; write version: %d at the top of the spec", Version)
	}

	if p, ok := f["package"]; ok && !isNull(p.val) {
		if name, ok := l.name(p.val, "package", "package: collectives"); ok {
			if err := CheckPackage(name); err != nil {
				l.errorf(p.val, "%s", err)
			}
			s.Package = name
		}
	} else if reportMissing(f, "package") {
		l.errorf(keyOr(p.key, root), "missing package; write package: collectives (the Go package name of the generated glue)")
	}

	s.DTypes = DTypes{
		Reduce: []coll.DType{coll.F32, coll.F16, coll.BF16},
		Copy:   []coll.DType{coll.F32, coll.F16, coll.BF16, coll.E4M3, coll.E5M2},
	}
	if d, ok := f["dtypes"]; ok {
		l.dtypes(d.val, "", &s.DTypes)
	}

	s.Ops = coll.Ops()
	if o, ok := f["ops"]; ok && !isNull(o.val) {
		s.Ops = l.ops(o.val)
	}

	s.OpPrograms = SharedOps
	if o, ok := f["op_programs"]; ok && !isNull(o.val) {
		var v string
		if r := resolve(o.val); r.Kind != yaml.ScalarNode || r.Decode(&v) != nil || v != SharedOps && v != SeparateOps {
			l.errorf(o.val, "op_programs must be %s or %s, not %s; write op_programs: %s (one program per reducing kernel, the op an argument) or %s (one per op)",
				SharedOps, SeparateOps, describe(o.val), SharedOps, SeparateOps)
		} else {
			s.OpPrograms = v
		}
	}

	declared := map[coll.Collective]map[coll.Algorithm]Launch{}
	if a, ok := f["algorithms"]; ok {
		declared = l.algorithms(a.val)
	}

	var topos []*topoSrc
	if t, ok := f["topologies"]; ok && !isNull(t.val) {
		for _, e := range l.mappingOf(t.val, "topologies", "topologies: {nvswitch: {kind: nvlink_full, ...}}") {
			topos = append(topos, l.topology(e, s))
		}
		if len(topos) == 0 && resolve(t.val).Kind == yaml.MappingNode {
			l.errorf(t.val, "no topologies; add one, e.g. topologies: {nvswitch: {kind: nvlink_full, world_sizes: [2-8], generate: {allreduce: [oneshot]}}}")
		}
	} else if reportMissing(f, "topologies") {
		l.errorf(keyOr(t.key, root), "missing topologies; add e.g. topologies: {nvswitch: {kind: nvlink_full, world_sizes: [2-8], generate: {allreduce: [oneshot]}}}")
	}

	if m, ok := f["multi_host"]; ok && !isNull(m.val) {
		s.MultiHost = l.multiHost(m.val)
	}

	for _, ts := range topos {
		l.crossCheck(ts, s)
		s.Topologies = append(s.Topologies, *ts.t)
	}
	slices.SortFunc(s.Topologies, func(a, b Topology) int { return cmp.Compare(a.Name, b.Name) })

	// Algorithms: declared ones plus every generated one, with launch params.
	for _, t := range s.Topologies {
		for c, algs := range t.Generate {
			for _, a := range algs {
				if declared[c] == nil {
					declared[c] = map[coll.Algorithm]Launch{}
				}
				if _, ok := declared[c][a]; !ok {
					declared[c][a] = DefaultLaunch()
				}
			}
		}
	}
	for c, m := range declared {
		for name, lp := range m {
			s.Algorithms = append(s.Algorithms, AlgorithmSpec{Collective: c, Name: name, Launch: lp})
		}
	}
	slices.SortFunc(s.Algorithms, func(a, b AlgorithmSpec) int {
		if d := a.Collective.Order() - b.Collective.Order(); d != 0 {
			return d
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return s
}

// keyOr returns k, or fallback if k is nil.
func keyOr(k, fallback *yaml.Node) *yaml.Node {
	if k != nil {
		return k
	}
	return fallback
}

// PackageError is CheckPackage's error: what is wrong with a package
// name, and a name that works.
type PackageError struct {
	// Name is the name checked.
	Name string
	// Msg says what is wrong and what to write instead.
	Msg string
}

// Error returns the message.
func (e *PackageError) Error() string { return e.Msg }

// maxPackageLen is the longest package name: it names the directory
// <out>/<package>, and file systems allow 255 bytes a name.
const maxPackageLen = 255

// CheckPackage says what is wrong with name as the Go package name of the
// generated glue (the spec's package, or generate's and init's --package):
// it must be a lower-case ASCII Go identifier other than "_", "main" (a program,
// not importable) and CUDAPackage, of at most 255 bytes (a directory name). The error, a *PackageError, suggests a
// name that works.
func CheckPackage(name string) error {
	fix := func() string {
		var b strings.Builder
		for _, r := range strings.ToLower(name) {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9' && b.Len() > 0:
				b.WriteRune(r)
			}
		}
		fixed := b.String()
		if len(fixed) > maxPackageLen {
			fixed = fixed[:32] // a name to start from
		}
		if fixed == "" || token.IsKeyword(fixed) || fixed == CUDAPackage || fixed == "main" {
			return "collectives"
		}
		return fixed
	}
	var msg string
	switch {
	case name == CUDAPackage:
		msg = fmt.Sprintf("package %q is the generated package of the CUDA sources (<out>/%s); write package: collectives", name, CUDAPackage)
	case name == "main":
		msg = `package "main" is a program, which no other package can import; write package: collectives`
	case name == "_" || !token.IsIdentifier(name):
		msg = fmt.Sprintf("package %q is not a Go identifier; write package: %s", name, fix())
	case strings.ToLower(name) == name && strings.IndexFunc(name, func(r rune) bool { return r > 0x7f }) >= 0:
		// Go accepts the identifier, but not an import path holding it.
		msg = fmt.Sprintf("package %q is not ASCII, and Go import paths must be; write package: %s", name, fix())
	case strings.ToLower(name) != name:
		msg = fmt.Sprintf("package %q must be lower case; write package: %s", name, fix())
	case len(name) > maxPackageLen:
		// It names the directory <out>/<package>.
		msg = fmt.Sprintf("package name is %d bytes, and it names the directory <out>/<package>, which may have at most %d; write package: %s", len(name), maxPackageLen, fix())
	default:
		return nil
	}
	return &PackageError{Name: name, Msg: msg}
}

// dtypes reads a `dtypes:` mapping into d, replacing each list given. of is
// "" at the top level, else ` of topology "x"`.
func (l *loader) dtypes(n *yaml.Node, of string, d *DTypes) {
	what := "dtypes" + of
	f := l.fields(n, what, "dtypes: {reduce: [f32, f16, bf16], copy: [f32, f16, bf16, e4m3, e5m2]}", dtypeFields)
	var reduceKnown, copyKnown []string
	for _, t := range coll.DTypes() {
		copyKnown = append(copyKnown, string(t))
		if !t.IsFloat8() {
			reduceKnown = append(reduceKnown, string(t))
		}
	}
	for _, use := range dtypeFields {
		fl, ok := f[use]
		if !ok {
			continue
		}
		if isNull(fl.val) {
			continue
		}
		list := []coll.DType{}
		ctx := "dtypes." + use + of
		for _, it := range l.seqOf(fl.val, ctx, use+": [f32, f16, bf16]") {
			name, ok := l.name(it, "a dtype in "+ctx, "a dtype such as f32")
			if !ok {
				continue
			}
			dt := coll.DType(name)
			switch {
			case !dt.Valid():
				known := copyKnown
				if use == "reduce" {
					known = reduceKnown
				}
				l.errorf(it, "%s", unknownName("dtype", name, known))
			case use == "reduce" && dt.IsFloat8():
				l.errorf(it, "%s is fp8, and fp8 only copies (all-gather): move it from dtypes.reduce to dtypes.copy%s", name, of)
			case !slices.Contains(list, dt):
				list = append(list, dt)
			}
		}
		if use == "reduce" {
			d.Reduce = list
		} else {
			d.Copy = list
		}
	}
}

// ops reads the `ops:` list.
func (l *loader) ops(n *yaml.Node) []coll.Op {
	out := []coll.Op{}
	for _, it := range l.seqOf(n, "ops", "ops: [sum, max, min]") {
		name, ok := l.name(it, "an op in ops", "sum, max or min")
		if !ok {
			continue
		}
		op := coll.Op(name)
		if !op.Valid() {
			l.errorf(it, "%s", unknownName("op", name, strs(coll.Ops())))
			continue
		}
		if !slices.Contains(out, op) {
			out = append(out, op)
		}
	}
	return out
}

// collective reads a collective name used as a key.
func (l *loader) collective(f field) (coll.Collective, bool) {
	c := coll.Collective(f.name)
	if !c.Valid() {
		l.errorf(f.key, "%s", unknownName("collective", f.name, strs(coll.Collectives())))
		return "", false
	}
	return c, true
}

// knownAlgorithms returns the names of the algorithms the schedule package
// has for c, sorted.
func knownAlgorithms(c coll.Collective) []string {
	return strs(schedule.Algorithms(c))
}

// algorithms reads the `algorithms:` section.
func (l *loader) algorithms(n *yaml.Node) map[coll.Collective]map[coll.Algorithm]Launch {
	out := map[coll.Collective]map[coll.Algorithm]Launch{}
	for _, cf := range l.mappingOf(n, "algorithms", "algorithms: {allreduce: {oneshot: {threads: 512}}}") {
		c, ok := l.collective(cf)
		if !ok {
			continue
		}
		ctx := "algorithms." + cf.name
		for _, af := range l.mappingOf(cf.val, ctx, cf.name+": {oneshot: {threads: 512}}") {
			known := knownAlgorithms(c)
			if af.name == string(coll.NCCL) {
				l.errorf(af.key, "nccl is not a generated algorithm and has no launch parameters; remove it from %s (known: %s)", ctx, strings.Join(known, ", "))
				continue
			}
			if !slices.Contains(known, af.name) {
				l.errorf(af.key, "%s", unknownName("algorithm", af.name, known))
				continue
			}
			if out[c] == nil {
				out[c] = map[coll.Algorithm]Launch{}
			}
			out[c][coll.Algorithm(af.name)] = l.launch(af.val, ctx+"."+af.name)
		}
	}
	return out
}

// launch reads launch parameters, defaulting omitted ones.
func (l *loader) launch(n *yaml.Node, what string) Launch {
	lp := DefaultLaunch()
	f := l.fields(n, what, "{threads: 512, max_blocks: 24, vector_bytes: 16}", launchFields)
	threadsBad := false
	if fl, ok := f["threads"]; ok && !isNull(fl.val) {
		threadsBad = true // until read and in range
		if v, ok := l.integer(fl.val, "threads", "threads: 512"); ok {
			if v < 64 || v > 1024 || v%32 != 0 {
				lo := min(max(v/32*32, 64), 1024)
				hi := min(max((v+31)/32*32, 64), 1024)
				fix := fmt.Sprintf("threads: %d", lo)
				if hi != lo {
					fix += fmt.Sprintf(" or threads: %d", hi)
				}
				l.errorf(fl.val, "threads %d must be a multiple of 32 from 64 to 1024; write %s", v, fix)
			} else {
				lp.Threads, threadsBad = int(v), false
			}
		}
	}
	if fl, ok := f["max_blocks"]; ok && !isNull(fl.val) {
		if v, ok := l.integer(fl.val, "max_blocks", "max_blocks: 24"); ok {
			if v < 1 || v > 128 {
				l.errorf(fl.val, "max_blocks %d must be from 1 to 128; write max_blocks: %d", v, min(max(v, 1), 128))
			} else {
				lp.MaxBlocks = int(v)
			}
		}
	}
	if fl, ok := f["vector_bytes"]; ok && !isNull(fl.val) {
		if v, ok := l.integer(fl.val, "vector_bytes", "vector_bytes: 16"); ok {
			if v != 4 && v != 8 && v != 16 {
				fix := 16
				if v < 6 {
					fix = 4
				} else if v < 12 {
					fix = 8
				}
				l.errorf(fl.val, "vector_bytes %d must be 4, 8 or 16; write vector_bytes: %d", v, fix)
			} else {
				lp.VectorBytes = int(v)
			}
		}
	}
	// min_threads is checked against threads: not against a default that
	// stood in for a threads already reported wrong (a second, misleading
	// error).
	if fl, ok := f["min_threads"]; ok && !isNull(fl.val) && !threadsBad {
		if v, ok := l.integer(fl.val, "min_threads", "min_threads: 256"); ok {
			if v < 64 || v > int64(lp.Threads) || v%32 != 0 {
				fix := min(max(v/32*32, 64), int64(lp.Threads))
				l.errorf(fl.val, "min_threads %d must be a multiple of 32 from 64 to threads (%d); write min_threads: %d", v, lp.Threads, fix)
			} else if v < int64(lp.Threads) {
				lp.MinThreads = int(v)
			}
		}
	}
	return lp
}

// topoName is the pattern of topology names (they name generated code).
var topoName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// topology reads one entry of `topologies:`.
func (l *loader) topology(e field, s *Spec) *topoSrc {
	t := &Topology{Name: e.name, DTypes: s.DTypes, Generate: map[coll.Collective][]coll.Algorithm{}, Select: map[coll.Collective][]Rule{}}
	ts := &topoSrc{t: t, key: e.key,
		genKey: map[coll.Collective]*yaml.Node{}, genItems: map[coll.Collective][]*yaml.Node{},
		selKey: map[coll.Collective]*yaml.Node{}, rules: map[coll.Collective][]ruleSrc{},
		perWorld: map[coll.Collective][]worldRules{}}
	in := fmt.Sprintf("topology %q", e.name)
	if !topoName.MatchString(e.name) {
		fix := strings.Trim(regexp.MustCompile(`[^a-z0-9_]+`).ReplaceAllString(strings.ToLower(e.name), "_"), "_")
		if fix == "" || fix[0] < 'a' || fix[0] > 'z' {
			fix = "t" + fix
		}
		l.errorf(e.key, "topology name %q must be lower-case letters, digits and _, starting with a letter (it names generated code); write %s", e.name, fix)
	}
	example := "{kind: nvlink_full, world_sizes: [2-8], generate: {allreduce: [oneshot]}}"
	if resolve(e.val) != nil && resolve(e.val).Kind != yaml.MappingNode && !isNull(e.val) {
		l.errorf(e.val, "%s must be a mapping, not %s; write %s: %s", in, describe(e.val), e.name, example)
		return ts
	}
	f := l.fields(e.val, in, example, topologyFields)

	// kind
	if k, ok := f["kind"]; ok && !isNull(k.val) {
		if name, ok := l.name(k.val, "kind", "kind: nvlink_full"); ok {
			t.Kind = coll.TopologyKind(name)
			ts.kindOK = t.Kind.Valid()
			if !ts.kindOK {
				l.errorf(k.val, "%s", unknownName("topology kind", name, strs(coll.TopologyKinds())))
			}
		}
	} else if reportMissing(f, "kind") {
		l.errorf(keyOr(k.key, e.key), "%s has no kind; write kind: followed by one of %s", in, strings.Join(strs(coll.TopologyKinds()), ", "))
	}

	// world_sizes
	if w, ok := f["world_sizes"]; ok && !isNull(w.val) {
		t.WorldSizes = l.worldSizes(w.val, ts)
	} else if reportMissing(f, "world_sizes") {
		l.errorf(keyOr(w.key, e.key), "%s has no world sizes; write world_sizes: %s", in, worldExample(t.Kind, ts.kindOK))
	}

	// link
	if lk, ok := f["link"]; ok && !isNull(lk.val) {
		t.Link = l.link(lk.val, in)
	}

	// dtypes
	if d, ok := f["dtypes"]; ok {
		l.dtypes(d.val, " of "+in, &t.DTypes)
	}

	// generate
	if g, ok := f["generate"]; ok {
		for _, cf := range l.mappingOf(g.val, "generate of "+in, "generate: {allreduce: [oneshot, twoshot]}") {
			c, ok := l.collective(cf)
			if !ok {
				continue
			}
			ctx := "generate." + cf.name
			ts.genKey[c] = cf.key
			items := l.seqOf(cf.val, ctx+" of "+in, cf.name+": [oneshot]")
			if len(items) == 0 {
				if isSeq(cf.val) || isNull(cf.val) {
					l.errorf(cf.key, "%s of %s lists no algorithms; list some, e.g. %s: [%s], or remove it (NCCL then runs %s)", ctx, in, cf.name, exampleAlg(c), cf.name)
				}
				continue
			}
			known := knownAlgorithms(c)
			for _, it := range items {
				name, ok := l.name(it, "an algorithm in "+ctx, "an algorithm name such as oneshot")
				if !ok {
					continue
				}
				alg := coll.Algorithm(name)
				switch {
				case alg == coll.NCCL:
					l.errorf(it, "nccl is never generated, only selected: remove it from %s and use it in select.%s", ctx, cf.name)
				case !slices.Contains(known, name):
					l.errorf(it, "%s", unknownName("algorithm", name, known))
				case slices.Contains(t.Generate[c], alg):
					l.errorf(it, "%q is listed twice in %s of %s; remove one", name, ctx, in)
				default:
					t.Generate[c] = append(t.Generate[c], alg)
					ts.genItems[c] = append(ts.genItems[c], it)
				}
			}
		}
	}
	if _, ok := f["generate"]; (!ok || isNull(f["generate"].val)) && reportMissing(f, "generate") {
		l.errorf(keyOr(f["generate"].key, e.key), "%s generates nothing; add e.g. generate: {allreduce: [oneshot]}", in)
	} else if g := resolve(f["generate"].val); ok && g != nil && g.Kind == yaml.MappingNode && len(g.Content) == 0 {
		// generate: {} is no different from an empty generate:.
		l.errorf(f["generate"].val, "%s generates nothing; add e.g. generate: {allreduce: [oneshot]}", in)
	}

	// select
	if sl, ok := f["select"]; ok {
		for _, cf := range l.mappingOf(sl.val, "select of "+in, "select: {allreduce: [{upto: 256KiB, use: oneshot}, {use: nccl}]}") {
			c, ok := l.collective(cf)
			if !ok {
				continue
			}
			ctx := "select." + cf.name
			if r := resolve(cf.val); r != nil && r.Kind == yaml.MappingNode {
				// Per world size; an empty mapping is the same as leaving
				// the collective out.
				if wr := l.selectPerWorld(cf, ts, in); len(wr) > 0 {
					ts.selKey[c] = cf.key
					ts.selOrder = append(ts.selOrder, c)
					ts.perWorld[c] = wr
				}
				continue
			}
			ts.selKey[c] = cf.key
			ts.selOrder = append(ts.selOrder, c)
			items := l.seqOf(cf.val, ctx+" of "+in, cf.name+": [{upto: 256KiB, use: oneshot}, {use: nccl}]")
			if len(items) == 0 && (isSeq(cf.val) || isNull(cf.val)) {
				l.errorf(cf.key, "%s of %s has no rules; add some, e.g. %s: [{upto: 256KiB, use: oneshot}, {use: nccl}], or remove it", ctx, in, cf.name)
			}
			for i, it := range items {
				ts.rules[c] = append(ts.rules[c], l.rule(it, fmt.Sprintf("%s[%d] of %s", ctx, i, in)))
			}
		}
	}
	return ts
}

// selectPerWorld reads a per-world select entry: a mapping from world sizes
// or "lo-hi" ranges to rule lists.
func (l *loader) selectPerWorld(cf field, ts *topoSrc, in string) []worldRules {
	ctx := "select." + cf.name
	var out []worldRules
	owner := map[int]string{} // world size -> key text
	for _, kf := range l.mappingOf(cf.val, ctx+" of "+in, cf.name+": {2: [{upto: 256KiB, use: oneshot}, {use: nccl}]}") {
		wr := worldRules{key: kf.key, text: kf.name}
		rk := resolve(kf.key)
		a, b, ok := parseWorldRange(kf.name)
		if rk == nil || (rk.Tag != "!!int" && rk.Tag != "!!str") || !ok {
			if kf.name == "upto" || kf.name == "use" || kf.name == "symmetric" {
				// One rule written without its list brackets.
				l.errorf(kf.key, "%s of %s is a list of rules, not one rule; write %s: [{upto: 256KiB, use: oneshot}, {use: nccl}] (or a mapping of world sizes to such lists)", ctx, in, cf.name)
				return nil
			}
			l.errorf(kf.key, "%s: key %q is not a world size; write 4 or a range such as 2-4", ctx, kf.name)
			continue
		}
		if a > b {
			l.errorf(kf.key, "%s: world size range %q runs backwards; write %d-%d", ctx, kf.name, b, a)
			continue
		}
		if b-a > maxWorld {
			b = a + maxWorld
		}
		for w := a; w <= b && len(ts.t.WorldSizes) > 0; w++ { // no world sizes: reported already
			if !slices.Contains(ts.t.WorldSizes, w) {
				l.errorf(kf.key, "%s: world size %d is not in world_sizes [%s] of %s; add it there or drop it here", ctx, w, formatWorlds(ts.t.WorldSizes), in)
				break
			}
		}
		reported := false
		for w := a; w <= b; w++ {
			if !slices.Contains(ts.t.WorldSizes, w) {
				continue
			}
			if prev, dup := owner[w]; dup {
				if !reported {
					l.errorf(kf.key, "%s: world size %d is in both %q and %q", ctx, w, prev, kf.name)
					reported = true
				}
				continue
			}
			owner[w] = kf.name
			wr.sizes = append(wr.sizes, w)
		}
		what := fmt.Sprintf("%s[%s]", ctx, kf.name)
		items := l.seqOf(kf.val, what+" of "+in, kf.name+": [{upto: 256KiB, use: oneshot}, {use: nccl}]")
		if len(items) == 0 && (isSeq(kf.val) || isNull(kf.val)) {
			l.errorf(kf.key, "%s of %s has no rules; add some, e.g. %s: [{upto: 256KiB, use: oneshot}, {use: nccl}], or remove it", what, in, kf.name)
		}
		for i, it := range items {
			wr.rules = append(wr.rules, l.rule(it, fmt.Sprintf("%s[%d] of %s", what, i, in)))
		}
		out = append(out, wr)
	}
	return out
}

// formatWorlds writes sorted world sizes with runs as ranges: "2-4, 8".
func formatWorlds(ws []int) string { return strings.Join(WorldRanges(ws), ", ") }

// WorldRanges writes sorted world sizes as the items of a world_sizes list,
// each run of consecutive sizes as one "lo-hi" range: [2 3 4 8] gives
// ["2-4", "8"].
func WorldRanges(ws []int) []string {
	var parts []string
	for i := 0; i < len(ws); {
		j := i
		for j+1 < len(ws) && ws[j+1] == ws[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ws[i], ws[j]))
		} else {
			parts = append(parts, strconv.Itoa(ws[i]))
		}
		i = j + 1
	}
	return parts
}

// exampleAlg names an algorithm of c for examples: oneshot if it exists.
func exampleAlg(c coll.Collective) string {
	known := knownAlgorithms(c)
	if len(known) == 0 || slices.Contains(known, "oneshot") {
		return "oneshot"
	}
	return known[0]
}

// isSeq reports whether n is a list.
func isSeq(n *yaml.Node) bool {
	r := resolve(n)
	return r != nil && r.Kind == yaml.SequenceNode
}

// worldExample suggests a world_sizes value for kind.
func worldExample(k coll.TopologyKind, ok bool) string {
	if !ok {
		return "[2-8]"
	}
	lo, hi, only := schedule.KindWorldSizes(k)
	if len(only) > 0 {
		return "[" + joinInts(only) + "]"
	}
	if lo == hi {
		return fmt.Sprintf("[%d]", lo)
	}
	return fmt.Sprintf("[%d-%d]", lo, hi)
}

// joinInts formats ints as "a, b, c".
func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}

// worldRange matches "lo-hi" (or a lone quoted "n").
var worldRange = regexp.MustCompile(`^\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?$`)

// parseWorldRange reads "lo-hi" or a lone "n" (as lo = hi = n).
func parseWorldRange(s string) (lo, hi int, ok bool) {
	m := worldRange.FindStringSubmatch(s)
	if m == nil {
		return 0, 0, false
	}
	lo, _ = strconv.Atoi(m[1])
	hi = lo
	if m[2] != "" {
		hi, _ = strconv.Atoi(m[2])
	}
	return lo, hi, true
}

// worldSizes reads `world_sizes:`, checking each size against the kind.
func (l *loader) worldSizes(n *yaml.Node, ts *topoSrc) []int {
	kind := ts.t.Kind
	ex := worldExample(kind, ts.kindOK)
	items := l.seqOf(n, "world_sizes", "world_sizes: "+ex)
	if len(items) == 0 {
		if r := resolve(n); r != nil && r.Kind == yaml.SequenceNode {
			l.errorf(n, "world_sizes is empty; write world_sizes: %s", ex)
		}
		return nil
	}
	lo, hi, only := 1, maxWorld, []int(nil)
	if ts.kindOK {
		lo, hi, only = schedule.KindWorldSizes(kind)
	}
	var out []int
	for _, it := range items {
		r := resolve(it)
		var a, b int64
		switch {
		case r != nil && r.Kind == yaml.ScalarNode && r.Tag == "!!int":
			v, ok := l.integer(it, "a world size", "a rank count such as 8")
			if !ok {
				continue
			}
			a, b = v, v
		case r != nil && r.Kind == yaml.ScalarNode && r.Tag == "!!str" && worldRange.MatchString(r.Value):
			lo, hi, _ := parseWorldRange(r.Value)
			a, b = int64(lo), int64(hi)
			if a > b {
				l.errorf(it, "world size range %q runs backwards; write %d-%d", r.Value, b, a)
				continue
			}
		default:
			l.errorf(it, "a world size must be an integer or a range \"lo-hi\", not %s; write e.g. world_sizes: %s", describe(it), ex)
			continue
		}
		if a < 1 {
			l.errorf(it, "world sizes start at 1, not %d; write world_sizes: %s", a, ex)
			continue
		}
		what := fmt.Sprintf("world size %d", a)
		if a != b {
			what = fmt.Sprintf("world sizes %d-%d", a, b)
		}
		if !ts.kindOK {
			if b > maxWorld {
				l.errorf(it, "%s: at most %d ranks are supported", what, maxWorld)
				continue
			}
			for v := a; v <= b; v++ {
				out = append(out, int(v))
			}
			continue
		}
		var bad []int
		for v := a; v <= b; v++ {
			ok := v >= int64(lo) && v <= int64(hi)
			if len(only) > 0 {
				ok = slices.Contains(only, int(v))
			}
			if ok {
				out = append(out, int(v))
			} else if len(bad) < 2 || a == b {
				bad = append(bad, int(v))
			}
			if v-a > maxWorld { // b is bounded by kind limits below
				break
			}
		}
		if len(bad) > 0 {
			var rule string
			switch {
			case len(only) == 1:
				rule = fmt.Sprintf("%s has exactly %d ranks", kind, only[0])
			case len(only) > 1:
				rule = fmt.Sprintf("%s has %s ranks", kind, strings.Join(strings.Split(joinInts(only), ", "), " or "))
			case lo == hi:
				rule = fmt.Sprintf("%s has exactly %d ranks", kind, lo)
			default:
				rule = fmt.Sprintf("%s has %d to %d ranks", kind, lo, hi)
			}
			verb := "are"
			if a == b {
				verb = "is"
			}
			l.errorf(it, "%s %s not possible: %s; write world_sizes: %s", what, verb, rule, ex)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// link reads `link:` hints.
func (l *loader) link(n *yaml.Node, in string) *Link {
	lk := &Link{}
	what := "link of " + in
	f := l.fields(n, what, "link: {bandwidth_gbps: 478, latency_us: 0.74}", linkFields)
	if fl, ok := f["bandwidth_gbps"]; ok && !isNull(fl.val) {
		if v, ok := l.number(fl.val, "bandwidth_gbps", "bandwidth_gbps: 478"); ok {
			if v <= 0 {
				l.errorf(fl.val, "bandwidth_gbps must be above 0 (GB/s per direction); write e.g. bandwidth_gbps: 478, or leave it out")
			}
			lk.BandwidthGBps = v
		}
	}
	if fl, ok := f["latency_us"]; ok && !isNull(fl.val) {
		if v, ok := l.number(fl.val, "latency_us", "latency_us: 0.74"); ok {
			if v < 0 {
				l.errorf(fl.val, "latency_us must not be negative (microseconds); write e.g. latency_us: 0.74, or leave it out")
			}
			lk.LatencyUS = v
		}
	}
	return lk
}

// rule reads one select rule.
func (l *loader) rule(n *yaml.Node, what string) ruleSrc {
	rs := ruleSrc{node: n}
	if r := resolve(n); r == nil || r.Kind != yaml.MappingNode {
		l.errorf(n, "%s must be a mapping, not %s; write e.g. {upto: 256KiB, use: oneshot}", what, describe(n))
		return rs
	}
	f := l.fields(n, what, "{upto: 256KiB, use: oneshot}", ruleFields)
	if u, ok := f["upto"]; ok && !isNull(u.val) {
		rs.uptoN = u.val
		r := resolve(u.val)
		switch {
		case r.Kind == yaml.ScalarNode && r.Tag == "!!int":
			if v, ok := l.integer(u.val, "upto", "upto: 256KiB"); ok {
				if v <= 0 {
					l.errorf(u.val, "upto must be above 0 bytes; write a size such as upto: 256KiB, or leave upto out for no upper bound")
				} else {
					rs.upto, rs.hasUpto = v, true
				}
			}
		case r.Kind == yaml.ScalarNode && r.Tag == "!!str":
			v, err := ParseSize(r.Value)
			switch {
			case errors.Is(err, ErrSizeTooLarge):
				l.errorf(u.val, "%v; leave upto out for no upper bound", err)
			case err != nil:
				l.errorf(u.val, "%v", err)
			case v <= 0:
				l.errorf(u.val, "upto must be above 0 bytes; write a size such as upto: 256KiB, or leave upto out for no upper bound")
			default:
				rs.upto, rs.hasUpto = v, true
			}
		default:
			l.errorf(u.val, "upto must be a size, not %s; write e.g. upto: 256KiB or upto: 262144", describe(u.val))
		}
		if !rs.hasUpto {
			rs.uptoN = nil
			rs.hasUpto = true // keep ordering checks quiet: the error is reported
			rs.upto = -1
		}
	}
	if u, ok := f["use"]; ok && !isNull(u.val) {
		rs.useN = u.val
		var use string
		use, rs.ok = l.name(u.val, "use", "use: oneshot or use: nccl")
		rs.use = coll.Algorithm(use)
	} else if reportMissing(f, "use") {
		l.errorf(keyOr(u.key, n), "%s has no use; write use: followed by an algorithm it generates or nccl", what)
	}
	if u, ok := f["symmetric"]; ok && !isNull(u.val) {
		if r := resolve(u.val); r.Kind == yaml.ScalarNode && r.Tag == "!!bool" && r.Decode(&rs.sym) == nil {
			rs.symN = u.val
		} else {
			l.errorf(u.val, "symmetric must be true or false, not %s; write symmetric: true", describe(u.val))
		}
	}
	return rs
}

// canRunKey identifies one schedule.CanRun question.
type canRunKey struct {
	kind       coll.TopologyKind
	collective coll.Collective
	algorithm  coll.Algorithm
	world      int
}

// canRunCache memoises schedule.CanRun, which builds and checks a whole
// schedule; its answers depend only on the arguments. Keys are bounded by the
// kinds, algorithms and world sizes the schedule package knows.
var canRunCache sync.Map // canRunKey -> error (nil stored as noErr)

// noErr stands for a nil error in canRunCache.
type noErr struct{}

// canRun is schedule.CanRun, memoised.
func canRun(kind coll.TopologyKind, c coll.Collective, alg coll.Algorithm, world int) error {
	k := canRunKey{kind, c, alg, world}
	if v, ok := canRunCache.Load(k); ok {
		if err, ok := v.(error); ok {
			return err
		}
		return nil
	}
	err := schedule.CanRun(k.kind, k.collective, k.algorithm, k.world)
	if err != nil {
		canRunCache.Store(k, err)
	} else {
		canRunCache.Store(k, noErr{})
	}
	return err
}

// crossCheck checks what depends on several fields of a topology (and the
// spec): world sizes an algorithm cannot run at, select rules naming
// algorithms not generated, the order of size ranges, fallbacks, dtypes.
func (l *loader) crossCheck(ts *topoSrc, s *Spec) {
	t := ts.t
	in := fmt.Sprintf("topology %q", t.Name)

	// Can the kind run each generated algorithm at each world size?
	if ts.kindOK && len(t.WorldSizes) > 0 {
		for _, c := range coll.Collectives() {
			runnable := func() []coll.Algorithm {
				var out []coll.Algorithm
				for _, a := range schedule.Algorithms(c) {
					ok := true
					for _, w := range t.WorldSizes {
						if canRun(t.Kind, c, a, w) != nil {
							ok = false
							break
						}
					}
					if ok {
						out = append(out, a)
					}
				}
				return out
			}
			for i, a := range t.Generate[c] {
				var bad []int
				why := ""
				for _, w := range t.WorldSizes {
					if err := canRun(t.Kind, c, a, w); err != nil {
						bad = append(bad, w)
						if why == "" {
							why = strings.TrimPrefix(err.Error(), fmt.Sprintf("%s %s: ", c, a))
						}
					}
				}
				if len(bad) == 0 {
					l.checkProtocolDTypes(t, c, a, ts.genItems[c][i], in)
					continue
				}
				var others []coll.Algorithm
				for _, r := range runnable() {
					if !slices.Contains(t.Generate[c], r) {
						others = append(others, r)
					}
				}
				alt := ""
				if len(others) > 0 {
					alt = " (it can run: " + strings.Join(strs(others), ", ") + ")"
				}
				if len(bad) == len(t.WorldSizes) {
					l.errorf(ts.genItems[c][i], "%s (%s) cannot run %s %q: %v; remove it from generate.%s%s", in, t.Kind, c, a, why, c, alt)
				} else {
					l.errorf(ts.genItems[c][i], "%s (%s) cannot run %s %q at world sizes %s: %v; remove those from world_sizes, or remove %q from generate.%s", in, t.Kind, c, a, joinInts(bad), why, a, c)
				}
			}
		}
	}

	// dtypes and ops for what is generated.
	for _, c := range coll.Collectives() {
		gk, ok := ts.genKey[c]
		if !ok || len(t.Generate[c]) == 0 {
			continue
		}
		if c.Reduces() {
			if len(t.DTypes.Reduce) == 0 {
				l.errorf(gk, "%s generates %s but has no reduce dtypes; list some in dtypes.reduce, e.g. reduce: [f32, f16, bf16]", in, c)
			}
			if len(s.Ops) == 0 {
				l.errorf(gk, "%s generates %s but ops is empty; write ops: [sum, max, min]", in, c)
			}
		} else if len(t.DTypes.Copy) == 0 {
			l.errorf(gk, "%s generates %s but has no copy dtypes; list some in dtypes.copy, e.g. copy: [f32, f16, bf16]", in, c)
		}
	}

	// Select rules.
	gpu := t.Kind.IsGPU() || !ts.kindOK
	t.SelectByWorld = map[coll.Collective]map[int][]Rule{}
	for _, c := range ts.selOrder {
		byWorld := map[int][]Rule{}
		if wrs, ok := ts.perWorld[c]; ok {
			for _, wr := range wrs {
				out := l.checkRules(ts, c, fmt.Sprintf("select.%s[%s]", c, wr.text), wr.rules, wr.sizes, gpu)
				for _, w := range wr.sizes {
					byWorld[w] = out
				}
			}
			for _, w := range t.WorldSizes {
				if _, ok := byWorld[w]; ok {
					continue
				}
				if gpu {
					byWorld[w] = []Rule{{Use: coll.NCCL}}
				} else {
					l.errorf(ts.selKey[c], "select.%s: world size %d has no rules; %s has no NCCL to fall back on: add a key covering %d", c, w, t.Kind, w)
				}
			}
		} else {
			out := l.checkRules(ts, c, "select."+string(c), ts.rules[c], t.WorldSizes, gpu)
			t.Select[c] = out
			for _, w := range t.WorldSizes {
				byWorld[w] = out
			}
		}
		t.SelectByWorld[c] = byWorld
	}
	if ts.kindOK && !gpu {
		for _, c := range coll.Collectives() {
			if len(t.Generate[c]) > 0 && len(ts.rules[c]) == 0 {
				if _, given := ts.selKey[c]; given {
					continue // reported as empty already
				}
				l.errorf(ts.genKey[c], "%s is %s, which has no NCCL to fall back on, so generate.%s needs select rules; add select: {%s: [{use: %s}]}", in, t.Kind, c, c, t.Generate[c][0])
			}
		}
	}
}

// checkRules checks one rule list of collective c at world sizes worlds,
// named ctx in messages ("select.allreduce" or "select.allreduce[4]"), and
// returns its rules with an unbounded NCCL rule appended on GPU kinds where
// the last is bounded.
func (l *loader) checkRules(ts *topoSrc, c coll.Collective, ctx string, rules []ruleSrc, worlds []int, gpu bool) []Rule {
	t := ts.t
	in := fmt.Sprintf("topology %q", t.Name)
	gen := t.Generate[c]
	choices := slices.Clone(gen)
	if gpu {
		choices = append(choices, coll.NCCL)
	}
	var out []Rule
	prevUpto, prevIdx := int64(0), -1
	for i, r := range rules {
		name := fmt.Sprintf("%s[%d]", ctx, i)
		if r.ok {
			switch {
			case r.use == coll.NCCL && !gpu:
				l.errorf(r.useN, "%s uses nccl, but %s is %s: its ranks are CPUs and NCCL cannot run there; use one of: %s", name, in, t.Kind, orNone(choices))
			case r.use == coll.NCCL || slices.Contains(gen, r.use):
			case r.use == coll.Hierarchical:
				l.errorf(r.useN, "%s uses hierarchical, which runs groups spanning hosts; a topology's rules are for the GPUs of one host: name it under multi_host: {select: ...} instead (docs/multihost.md), and use one of: %s here", name, orNone(choices))
			case !slices.Contains(schedule.Algorithms(c), r.use):
				known := knownAlgorithms(c)
				if gpu {
					known = append(known, string(coll.NCCL))
				}
				l.errorf(r.useN, "%s: %s", name, unknownName("algorithm", string(r.use), known))
			default:
				l.errorf(r.useN, "%s uses %q, which %s does not generate; add it to generate.%s or use one of: %s", name, r.use, in, c, orNone(choices))
			}
		}
		if r.sym && r.ok {
			l.checkSymmetricRule(ts, c, name, r, gpu)
		}
		if !r.sym && r.ok && !r.hasUpto && gpu {
			l.checkUnboundedRule(c, name, r, worlds)
		}
		if i < len(rules)-1 && r.node != nil && !r.hasUpto && resolve(r.node).Kind == yaml.MappingNode && !(r.sym && noneSymmetric(rules[i+1:])) {
			l.errorf(r.node, "%s has no upto but is not the last rule; only the last rule (or a symmetric rule followed by plain ones only) may leave upto out (the rules after it could never be chosen): give it an upto or remove the rules after it", name)
		}
		if r.hasUpto && r.upto > 0 {
			if prevIdx >= 0 && r.upto <= prevUpto {
				l.errorf(r.uptoN, "%s upto %s is not above %s[%d]'s upto %s; size ranges must be strictly increasing: reorder the rules or raise this upto above %s", name, FormatSize(r.upto), ctx, prevIdx, FormatSize(prevUpto), FormatSize(prevUpto))
			} else {
				prevUpto, prevIdx = r.upto, i
			}
		}
		upto := r.upto
		if !r.hasUpto || upto < 0 {
			upto = 0
		}
		out = append(out, Rule{UpTo: upto, Use: r.use, Symmetric: r.sym})
	}
	if plain := plainRules(out); len(plain) > 0 && plain[len(plain)-1].UpTo != 0 {
		if gpu {
			out = append(out, Rule{Use: coll.NCCL})
		} else {
			last := rules[len(rules)-1]
			l.errorf(last.node, "the last rule of %s bounds the size, but %s is %s and has no NCCL to fall back on; leave upto out of the last rule", ctx, in, t.Kind)
		}
	}
	return out
}

// noneSymmetric reports whether no rule of rules is a symmetric one.
func noneSymmetric(rules []ruleSrc) bool {
	for _, r := range rules {
		if r.sym {
			return false
		}
	}
	return true
}

// plainRules is rules without the symmetric ones: what a staged call sees.
func plainRules(rules []Rule) []Rule {
	var out []Rule
	for _, r := range rules {
		if !r.Symmetric {
			out = append(out, r)
		}
	}
	return out
}

// checkSymmetricRule checks that a symmetric rule's algorithm can serve
// inputs in symmetric memory: nccl, or a generated algorithm that reads
// its input in place (a barrier schedule) and needs no scratch, so no
// staging bounds the sizes it takes. Host kinds have no symmetric memory.
func (l *loader) checkSymmetricRule(ts *topoSrc, c coll.Collective, name string, r ruleSrc, gpu bool) {
	t := ts.t
	if !gpu {
		l.errorf(r.symN, "%s is symmetric, but topology %q is %s: CPU ranks have no symmetric device memory; remove symmetric: true", name, t.Name, t.Kind)
		return
	}
	if r.use == coll.NCCL || !slices.Contains(t.Generate[c], r.use) || len(t.WorldSizes) == 0 {
		return // nccl, or an unknown algorithm reported already
	}
	s, err := schedule.Build(c, r.use, t.WorldSizes[0])
	if err != nil {
		return // reported by the generate checks
	}
	if s.Protocol.Push() {
		l.errorf(r.useN, "%s is symmetric but uses %s, a push (%s) algorithm: it sends from its input and never reads it in place; use a barrier algorithm such as oneshot, or nccl", name, r.use, s.Protocol)
		return
	}
	if s.UsesScratch { // every schedule that touches scratch declares it (schedule.Validate)
		l.errorf(r.useN, "%s is symmetric but uses %s, which reduces into scratch sized by the staging buffer, so it cannot take sizes beyond it; use oneshot or nccl", name, r.use)
	}
}

// checkUnboundedRule checks that a plain rule without upto (it takes every
// size above the rule before it) uses an algorithm whose kernels take any
// size at every world size of its list: barrier kernels and push kernels
// in rounds do; a push kernel without rounds (the reduce-scatter's and
// all-gather's oneshot_ll) needs an inbox holding the whole message, so
// comm.New would refuse the rule at run time.
func (l *loader) checkUnboundedRule(c coll.Collective, name string, r ruleSrc, worlds []int) {
	if r.use == coll.NCCL || !slices.Contains(schedule.Algorithms(c), r.use) {
		return
	}
	for _, w := range worlds {
		s, err := schedule.Build(c, r.use, w)
		if err != nil || !s.Protocol.Push() {
			continue
		}
		if _, rounds := schedule.PushRounds(s); rounds {
			continue
		}
		l.errorf(r.useN, "%s sends every larger size to %s, a push kernel that runs in one round (at world size %d): its inbox would have to hold the largest message, so comm.New refuses the rule; give it an upto (e.g. upto: 128KiB) and a rule after it (oneshot_ll128, oneshot or nccl)", name, r.use, w)
		return
	}
}

// orNone joins names, or says "(none)".
func orNone(v []coll.Algorithm) string {
	if len(v) == 0 {
		return "(none: add an algorithm to generate first)"
	}
	return strings.Join(strs(v), ", ")
}

// multiHost reads multi_host: {select: {allreduce: [rules], ...}}: the
// rules of groups spanning hosts. Each rule uses hierarchical or nccl
// (plain NCCL over all ranks), bounds grow, only the last rule may leave
// upto out, and a bounded last rule is followed by NCCL (as Choose does).
func (l *loader) multiHost(n *yaml.Node) map[coll.Collective][]Rule {
	const example = "multi_host: {select: {allreduce: [{upto: 64KiB, use: nccl}, {use: hierarchical}]}}"
	f := l.fields(n, "multi_host", example, multiHostFields)
	sl, ok := f["select"]
	if !ok || isNull(sl.val) {
		if reportMissing(f, "select") {
			l.errorf(n, "multi_host has no select; write %s", example)
		}
		return nil
	}
	out := map[coll.Collective][]Rule{}
	for _, cf := range l.mappingOf(sl.val, "multi_host.select", example) {
		c, ok := l.collective(cf)
		if !ok {
			continue
		}
		ctx := "multi_host.select." + cf.name
		items := l.seqOf(cf.val, ctx, cf.name+": [{upto: 64KiB, use: nccl}, {use: hierarchical}]")
		if len(items) == 0 {
			l.errorf(cf.key, "%s has no rules; add some, e.g. %s: [{upto: 64KiB, use: nccl}, {use: hierarchical}], or remove it", ctx, cf.name)
			continue
		}
		var rules []Rule
		prev := int64(0)
		for i, it := range items {
			name := fmt.Sprintf("%s[%d]", ctx, i)
			r := l.rule(it, name)
			switch {
			case r.sym:
				l.errorf(r.symN, "%s is symmetric, but rules across hosts apply to every input; remove symmetric: true", name)
			case r.ok && r.use != coll.Hierarchical && r.use != coll.NCCL:
				l.errorf(r.useN, "%s uses %q; a group spanning hosts runs hierarchical (these kernels in each host, NCCL between hosts) or nccl (NCCL over all ranks)", name, r.use)
			}
			if i < len(items)-1 && !r.hasUpto && resolve(it).Kind == yaml.MappingNode {
				l.errorf(it, "%s has no upto but is not the last rule; only the last rule may leave upto out", name)
			}
			if r.hasUpto && r.upto > 0 {
				if r.upto <= prev {
					l.errorf(r.uptoN, "%s upto %s is not above the previous rule's %s; size ranges must be strictly increasing", name, FormatSize(r.upto), FormatSize(prev))
				}
				prev = max(prev, r.upto)
			}
			upto := r.upto
			if !r.hasUpto || upto < 0 {
				upto = 0
			}
			rules = append(rules, Rule{UpTo: upto, Use: r.use})
		}
		if rules[len(rules)-1].UpTo != 0 {
			rules = append(rules, Rule{Use: coll.NCCL})
		}
		out[c] = rules
	}
	return out
}

// checkProtocolDTypes refuses a generated algorithm whose protocol carries
// none of the dtypes the topology generates for its collective (a Lamport
// algorithm on integer types): it would generate no kernel. Dtypes it does
// not carry, beside ones it does, only get no kernel of it.
func (l *loader) checkProtocolDTypes(t *Topology, c coll.Collective, a coll.Algorithm, at *yaml.Node, in string) {
	dts, kind := t.DTypes.Copy, "copy"
	if c.Reduces() {
		dts, kind = t.DTypes.Reduce, "reduce"
	}
	p := a.Protocol()
	if len(dts) == 0 || slices.ContainsFunc(dts, p.Supports) {
		return
	}
	l.errorf(at, "%s generates %s %q, whose %s protocol carries only f16, bf16 and f32, but none of its %s dtypes (%s); remove it from generate.%s or add one of those dtypes",
		in, c, a, p, kind, strings.Join(strs(dts), ", "), c)
}
