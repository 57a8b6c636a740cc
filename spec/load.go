package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// DefaultFile is the spec file Load reads when given a directory.
const DefaultFile = "collgen.yaml"

// maxSpecBytes bounds the size of a spec file.
const maxSpecBytes = 4 << 20

// Load reads and validates the spec at path: a file, or a directory holding
// collgen.yaml. Problems in the spec come back as an ErrorList holding all
// of them; a nil *Spec is returned whenever the error is non-nil.
func Load(path string) (*Spec, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("spec %w", err)
	}
	if fi.IsDir() {
		path = filepath.Join(path, DefaultFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("spec %w", err)
	}
	defer f.Close()
	// One byte past the limit is enough to report it (Parse does): an
	// endless file (/dev/zero, a pipe) is never read whole.
	data, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("spec %w", err)
	}
	return Parse(filepath.ToSlash(path), data)
}

// Parse validates the spec in data; name is the file name used in errors and
// in Sources. It returns an ErrorList holding every problem found, sorted by
// position, or the spec.
func Parse(name string, data []byte) (*Spec, error) {
	l := &loader{file: name}
	s := l.parse(data)
	if len(l.errs) > 0 || s == nil {
		if len(l.errs) == 0 {
			l.errorf(nil, "spec could not be read")
		}
		l.errs.sort()
		return nil, dedupe(l.errs)
	}
	s.Sources = []Source{{Path: name, Content: bytes.Clone(data)}}
	return s, nil
}

// dedupe drops errors identical to the previous one in a sorted list (an
// aliased node may be checked more than once).
func dedupe(l ErrorList) ErrorList {
	out := l[:0]
	for i, e := range l {
		if i > 0 && *e == *l[i-1] {
			continue
		}
		out = append(out, e)
	}
	return out
}

// syntaxLine matches the line number in yaml.v3's syntax errors. That
// number is not reliable: for parser errors yaml.v3 reports the 0-based
// line of the enclosing construct (often the top-level mapping, so a spec
// starting with a comment got "line 2"), so locateSyntax finds the real
// position instead.
var syntaxLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// maxDepth bounds how deeply a spec's collections may nest; real specs
// need 5 levels.
const maxDepth = 32

// decode reads the next YAML document, turning panics into errors.
func decode(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: %v", r)
		}
	}()
	return dec.Decode(n)
}

// syntaxMessage strips yaml.v3's "yaml: " and "line N: " prefixes.
func syntaxMessage(err error) string {
	if m := syntaxLine.FindStringSubmatch(err.Error()); m != nil {
		return m[2]
	}
	return err.Error()
}

// parseError returns the syntax message of the first document of data
// that fails to decode, or "" when every document decodes.
func parseError(data []byte) string {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := decode(dec, &n)
		if errors.Is(err, io.EOF) {
			return ""
		}
		if err != nil {
			return syntaxMessage(err)
		}
	}
}

// locateSyntax finds where in data the syntax error msg arises: the
// shortest prefix of whole lines that fails with the same message gives
// the line, and the shortest prefix of that line the column (1 when no
// prefix of the line reproduces it). The line is found by bisection, so a
// spec of n lines costs about log2(n) parses, plus one per character of
// the line for the column.
func locateSyntax(data []byte, msg string) (line, col int) {
	var starts []int // byte offset of each line
	for i := 0; i < len(data); {
		starts = append(starts, i)
		j := bytes.IndexByte(data[i:], '\n')
		if j < 0 {
			break
		}
		i += j + 1
	}
	end := func(l int) int { // offset just past line l (1-based)
		if l < len(starts) {
			return starts[l]
		}
		return len(data)
	}
	fails := func(n int) bool { return parseError(data[:n]) == msg }
	if len(starts) == 0 || len(data) > maxLocateBytes || !fails(len(data)) {
		return 0, 0
	}
	lo, hi := 1, len(starts) // the first failing line is in [lo, hi]
	for lo < hi {
		mid := (lo + hi) / 2
		if fails(end(mid)) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	line = lo
	first := starts[line-1]
	text := bytes.TrimRight(data[first:end(line)], "\r\n")
	// Columns are counted in characters; bisect over byte offsets of
	// character starts.
	var offs []int
	for i := range string(text) {
		offs = append(offs, i)
	}
	offs = append(offs, len(text))
	k := len(offs) - 1 // a prefix of offs[k] bytes holds k characters
	if k < 1 || !fails(first+offs[k]) {
		return line, 1
	}
	if len(data) <= linearColumnBytes && k <= linearColumnChars {
		// The column is where the failure becomes permanent: step back
		// while shorter prefixes of the line still fail. (Bisection could
		// stop inside an unclosed bracket or quote, which fails the same
		// way when cut short.)
		for k > 1 && fails(first+offs[k-1]) {
			k--
		}
		return line, k
	}
	clo, chi := 1, k
	for clo < chi {
		mid := (clo + chi) / 2
		if fails(first + offs[mid]) {
			chi = mid
		} else {
			clo = mid + 1
		}
	}
	return line, clo
}

// maxLocateBytes is the largest spec locateSyntax searches (each probe
// parses a prefix); larger ones fall back to yaml.v3's line.
const maxLocateBytes = 1 << 20

// linearColumnBytes and linearColumnChars are the spec size and line
// length up to which locateSyntax finds the column by stepping back one
// character at a time (one parse each) rather than by bisection.
const (
	linearColumnBytes = 64 << 10
	linearColumnChars = 512
)

// checkText reports the first byte YAML cannot hold in a spec: invalid
// UTF-8 (including UTF-16 text) or a control character other than tab,
// newline and carriage return. yaml.v3 reports those without a position.
func (l *loader) checkText(data []byte) bool {
	line, col := 1, 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		var msg string
		switch {
		case r == utf8.RuneError && size <= 1:
			msg = fmt.Sprintf("byte %#02x is not UTF-8: a spec is UTF-8 text (is this a binary or UTF-16 file?)", data[i])
		case r == '\uFEFF' && i == 0:
			// A UTF-8 byte order mark is harmless.
		case r < 0x20 && r != '\t' && r != '\n' && r != '\r', r == 0x7f, r >= 0x80 && r < 0xa0:
			msg = fmt.Sprintf("control character %U is not allowed in a spec", r)
		}
		if msg != "" {
			l.errs = append(l.errs, &Error{File: l.file, Line: line, Col: col, Msg: msg})
			return false
		}
		if r == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
		i += size
	}
	return true
}

// syntaxError records a YAML syntax error at the position locateSyntax
// finds, or at yaml.v3's line (when it gives one) as a last resort.
func (l *loader) syntaxError(data []byte, err error) {
	msg := syntaxMessage(err)
	line, col := locateSyntax(data, msg)
	if line > 1 && commentLine(data, line) {
		// A comment cannot fail: the text above it already does when cut
		// there, so the error arose earlier (a quote opened above and
		// closed by an apostrophe in this comment). Point at where that
		// text starts failing.
		prefix := data[:lineStart(data, line)]
		if m := parseError(prefix); m != "" {
			if l2, c2 := locateSyntax(prefix, m); l2 > 0 {
				msg = fmt.Sprintf("%s at line %d; a quote or bracket opened here is still open there (%s)", msg, line, m)
				line, col = l2, c2
			}
		}
	}
	if line == 0 {
		if m := syntaxLine.FindStringSubmatch(err.Error()); m != nil && m[1] != "" {
			line, _ = strconv.Atoi(m[1])
			col = 1
		}
	}
	if line == 0 {
		line, col = 1, 1
	}
	if tab := lineStart(data, line) + col - 1; tab < len(data) && data[tab] == '\t' && strings.HasPrefix(msg, "found character that cannot start any token") {
		msg += "; a tab indents this line, and YAML indents with spaces only: replace the tab with spaces"
	}
	l.errs = append(l.errs, &Error{File: l.file, Line: line, Col: col, Msg: "YAML syntax error: " + msg})
}

// lineStart is the byte offset of 1-based line in data (len(data) past the end).
func lineStart(data []byte, line int) int {
	off := 0
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return len(data)
		}
		off += i + 1
	}
	return off
}

// commentLine reports whether 1-based line of data holds only a comment.
func commentLine(data []byte, line int) bool {
	rest := data[lineStart(data, line):]
	if i := bytes.IndexByte(rest, '\n'); i >= 0 {
		rest = rest[:i]
	}
	return bytes.HasPrefix(bytes.TrimSpace(rest), []byte("#"))
}

// checkFlowDepth reports the first '[' or '{' that opens a flow collection
// deeper than maxDepth, before yaml.v3 spends time on it (it allows 10,000
// levels). Quoted strings and comments are skipped; a bracket inside a
// plain scalar counts too, which no real spec nests 32 deep.
func (l *loader) checkFlowDepth(data []byte) bool {
	depth, line, col := 0, 1, 0
	var quote byte
	comment := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		col++
		if c == '\n' {
			line, col, comment = line+1, 0, false
			if quote == 0 {
				continue
			}
		}
		switch {
		case comment:
		case quote == '"' && c == '\\':
			i++
			col++
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && (i == 0 || data[i-1] == ' ' || data[i-1] == '\t' || data[i-1] == '\n'):
			comment = true
		case c == '[' || c == '{':
			depth++
			if depth > maxDepth {
				l.errs = append(l.errs, &Error{File: l.file, Line: line, Col: col,
					Msg: fmt.Sprintf("nested more than %d levels deep; a spec needs far fewer (see docs/spec.md)", maxDepth)})
				return false
			}
		case c == ']' || c == '}':
			depth = max(depth-1, 0)
		}
	}
	return true
}

// checkDepth reports the first collection nested deeper than maxDepth.
func (l *loader) checkDepth(n *yaml.Node, depth int) bool {
	if n == nil {
		return true
	}
	if depth > maxDepth {
		l.errorf(n, "nested more than %d levels deep; a spec needs far fewer (see docs/spec.md)", maxDepth)
		return false
	}
	for _, c := range n.Content {
		if !l.checkDepth(c, depth+1) {
			return false
		}
	}
	return true
}

// parse reads data into a Spec, recording every problem in l.errs.
func (l *loader) parse(data []byte) *Spec {
	if len(data) > maxSpecBytes {
		l.errorf(nil, "spec is more than the %d bytes a spec may have", maxSpecBytes)
		return nil
	}
	if !l.checkText(data) || !l.checkFlowDepth(data) {
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := decode(dec, &doc); err != nil {
		if errors.Is(err, io.EOF) {
			l.errorf(nil, "empty spec; start with version: 1 (see docs/spec.md)")
		} else {
			l.syntaxError(data, err)
		}
		return nil
	}
	var extra yaml.Node
	switch err := decode(dec, &extra); {
	case err == nil:
		l.errorf(&extra, "a spec is one YAML document; remove this second document (and the --- before it)")
	case !errors.Is(err, io.EOF):
		l.syntaxError(data, err)
	}
	if !l.checkDepth(&doc, 0) {
		return nil
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			l.errorf(nil, "empty spec; start with version: 1 (see docs/spec.md)")
			return nil
		}
		root = root.Content[0]
	}
	if resolve(root).Kind != yaml.MappingNode {
		l.errorf(root, "a spec must be a mapping of fields (version, package, dtypes, ops, algorithms, topologies), not %s", describe(root))
		return nil
	}
	return l.spec(root)
}
