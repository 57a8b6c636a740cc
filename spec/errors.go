package spec

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Error is one problem in a spec file, with its position.
type Error struct {
	// File is the path of the file as given.
	File string
	// Line and Col are 1-based; Col is 1 when only the line is known (YAML
	// syntax errors), and both are 0 when the position is unknown.
	Line, Col int
	// Msg says what is wrong and what to write instead.
	Msg string
}

// Error returns "file:line:col: msg" ("file: msg" without a position).
func (e *Error) Error() string {
	if e.Line <= 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
}

// ErrorList is every problem found in a spec, sorted by file, line and
// column. Load and Parse return a non-empty ErrorList as their error.
type ErrorList []*Error

// Error joins all errors, one a line, sorted by position.
func (l ErrorList) Error() string {
	s := slices.Clone(l)
	s.sort()
	var b strings.Builder
	for i, e := range s {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns the errors, for errors.Is and errors.As.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// sort orders l by file, line and column, keeping the order in which errors
// were found among errors at the same position.
func (l ErrorList) sort() {
	slices.SortStableFunc(l, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col))
	})
}

// suggest returns the candidate closest to word, or "" if none is close
// enough to be a likely typo.
func suggest(word string, candidates []string) string {
	best, bestD := "", -1
	lw := strings.ToLower(word)
	for _, c := range candidates {
		d := editDistance(lw, strings.ToLower(c))
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" || best == word {
		return ""
	}
	limit := 1
	if n := len([]rune(word)); n >= 4 {
		limit = 2
	}
	if n := len([]rune(word)); n >= 9 {
		limit = 3
	}
	if bestD > limit {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance of a and b:
// insertions, deletions, substitutions and transpositions of adjacent
// characters each cost 1.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	if len(ra) > 64 || len(rb) > 64 {
		// Long words are never typos of short names; avoid quadratic work.
		if a == b {
			return 0
		}
		return max(len(ra), len(rb))
	}
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// didYouMean returns `; did you mean "x"?` for the closest candidate, or "".
func didYouMean(word string, candidates []string) string {
	if s := suggest(word, candidates); s != "" {
		return fmt.Sprintf("; did you mean %q?", s)
	}
	return ""
}

// unknownName formats `unknown <what> "word"; did you mean "x"? (known: a, b)`.
func unknownName(what, word string, known []string) string {
	msg := fmt.Sprintf("unknown %s %q", what, word)
	if s := suggest(word, known); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	}
	if len(known) == 0 {
		return msg + " (none known)"
	}
	return msg + " (known: " + strings.Join(known, ", ") + ")"
}

// strs converts a slice of string-like values to []string.
func strs[T ~string](v []T) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = string(x)
	}
	return out
}
