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
		return nil, err
	}
	if fi.IsDir() {
		path = filepath.Join(path, DefaultFile)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
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

// syntaxLine matches the line number in yaml.v3's syntax errors.
var syntaxLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// decode reads the next YAML document, turning panics into errors.
func decode(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: %v", r)
		}
	}()
	return dec.Decode(n)
}

// syntaxError records a YAML syntax error with its line.
func (l *loader) syntaxError(err error) {
	msg := err.Error()
	if m := syntaxLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		l.errs = append(l.errs, &Error{File: l.file, Line: max(line, 1), Col: 1, Msg: "YAML syntax error: " + m[2]})
		return
	}
	if len(msg) > 6 && msg[:6] == "yaml: " {
		msg = msg[6:]
	}
	l.errs = append(l.errs, &Error{File: l.file, Msg: "YAML syntax error: " + msg})
}

// parse reads data into a Spec, recording every problem in l.errs.
func (l *loader) parse(data []byte) *Spec {
	if len(data) > maxSpecBytes {
		l.errorf(nil, "spec is %d bytes, more than the %d a spec may have", len(data), maxSpecBytes)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := decode(dec, &doc); err != nil {
		if errors.Is(err, io.EOF) {
			l.errorf(nil, "empty spec; start with version: 1 (see docs/spec.md)")
		} else {
			l.syntaxError(err)
		}
		return nil
	}
	var extra yaml.Node
	switch err := decode(dec, &extra); {
	case err == nil:
		l.errorf(&extra, "a spec is one YAML document; remove this second document (and the --- before it)")
	case !errors.Is(err, io.EOF):
		l.syntaxError(err)
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
