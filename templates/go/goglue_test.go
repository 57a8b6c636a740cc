package goglue

import (
	"strings"
	"testing"

	"github.com/dave/jennifer/jen"
)

func TestRenderShowsNumberedSource(t *testing.T) {
	f := jen.NewFile("p")
	f.Func().Id("f").Params().Block(jen.Op("+++"))
	_, err := render(map[string]*jen.File{"bad.go": f})
	if err == nil || !strings.Contains(err.Error(), "render bad.go: ") || !strings.Contains(err.Error(), "    5  +++") {
		t.Errorf("got %v", err)
	}
}

func TestCommentTextWraps(t *testing.T) {
	got := commentText(strings.Repeat("word ", 30))
	for _, line := range strings.Split(got, "\n") {
		if len(line) > 80 || !strings.HasPrefix(line, "// ") {
			t.Errorf("line %q", line)
		}
	}
}
