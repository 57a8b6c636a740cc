package spec

import (
	"errors"
	"strings"
	"testing"
)

// rangeSpec is a minimal spec whose launch, world sizes, link, select and
// multi_host TestRangeBounds replaces.
const rangeSpec = `version: 1
package: coll
algorithms:
  allreduce:
    oneshot: LAUNCH
topologies:
  z:
    kind: KIND
    world_sizes: [WORLDS]
    link: LINK
    generate: {allreduce: [oneshot]}
    select: {allreduce: SELECT}
MULTI`

// TestRangeBounds: every range check accepts its bounds and refuses the
// first value past each.
func TestRangeBounds(t *testing.T) {
	base := map[string]string{
		"LAUNCH": "{threads: 256}", "KIND": "nvlink_full", "WORLDS": "2-4", "LINK": "{bandwidth_gbps: 100}",
		"SELECT": "[{use: oneshot}]", "MULTI": "",
	}
	for _, c := range []struct {
		key, val string
		want     string // an error's text; "" for none
	}{
		{"LAUNCH", "{threads: 64}", ""},
		{"LAUNCH", "{threads: 32}", "threads 32 must be a multiple of 32 from 64 to 1024"},
		{"LAUNCH", "{threads: 1024}", ""},
		{"LAUNCH", "{max_blocks: 1}", ""},
		{"LAUNCH", "{max_blocks: 128}", ""},
		{"LAUNCH", "{max_blocks: 129}", "max_blocks 129 must be from 1 to 128"},
		{"LAUNCH", "{threads: 256, min_threads: 64}", ""},
		{"LAUNCH", "{threads: 256, min_threads: 256}", ""},
		{"LAUNCH", "{threads: 256, min_threads: 32}", "min_threads 32 must be a multiple of 32 from 64 to threads (256)"},
		{"LAUNCH", "{threads: 256, min_threads: 288}", "min_threads 288 must be"},
		{"KIND", "warp_drive", "unknown"}, // the kind's own error only
		{"LINK", "{latency_us: 0}", ""},
		{"LINK", "{latency_us: -0.5}", "latency_us must not be negative"},
		{"SELECT", `{"2-3": [{use: oneshot}], "4": [{use: oneshot}]}`, ""},
		{"SELECT", `{"3-2": [{use: oneshot}], "4": [{use: oneshot}]}`, `world size range "3-2" runs backwards`},
		{"MULTI", "multi_host: {select: {allreduce: [{upto: 64KiB, use: nccl}, {upto: 1MiB, use: hierarchical}]}}", ""},
		{"MULTI", "multi_host: {select: {allreduce: [{upto: 64KiB, use: nccl}, {upto: 64KiB, use: hierarchical}]}}", "upto 64KiB is not above the previous rule's 64KiB"},
	} {
		src := rangeSpec
		for k, v := range base {
			if k == c.key {
				v = c.val
			}
			src = strings.Replace(src, k, v, 1)
		}
		_, err := Parse("range.yaml", []byte(src))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %s: %v", c.key, c.val, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %s: %v; want an error with %q", c.key, c.val, err, c.want)
		case c.key == "KIND" && err != nil && strings.Contains(err.Error(), "at most"):
			t.Errorf("%s: %s: %v; world sizes 2-4 are within maxWorld", c.key, c.val, err)
		}
	}
}

// TestUnknownKindWorldBound: a topology of an unknown kind still bounds
// its world sizes by maxWorld.
func TestUnknownKindWorldBound(t *testing.T) {
	for _, c := range []struct {
		worlds string
		over   bool
	}{{"4096", false}, {"4097", true}, {"4000-4097", true}} {
		src := strings.NewReplacer("LAUNCH", "{}", "KIND", "warp_drive", "WORLDS", c.worlds, "LINK", "{}",
			"SELECT", "[{use: oneshot}]", "MULTI", "").Replace(rangeSpec)
		_, err := Parse("range.yaml", []byte(src))
		if err == nil {
			t.Fatalf("world sizes %s of kind warp_drive: no error", c.worlds)
		}
		if got := strings.Contains(err.Error(), "at most 4096 ranks are supported"); got != c.over {
			t.Errorf("world sizes %s: %v; want a maxWorld error: %v", c.worlds, err, c.over)
		}
	}
}

// TestMinThreadsEqualThreads: min_threads equal to threads leaves blocks
// fixed (MinThreads 0), below it lets them shrink.
func TestMinThreadsEqualThreads(t *testing.T) {
	for _, c := range []struct {
		launch string
		want   Launch
	}{
		{"{threads: 256, min_threads: 256}", Launch{Threads: 256, MaxBlocks: 24, VectorBytes: 16}},
		{"{threads: 256, min_threads: 128}", Launch{Threads: 256, MaxBlocks: 24, VectorBytes: 16, MinThreads: 128}},
	} {
		src := strings.NewReplacer("LAUNCH", c.launch, "KIND", "nvlink_full", "WORLDS", "2", "LINK", "{}",
			"SELECT", "[{use: oneshot}]", "MULTI", "").Replace(rangeSpec)
		s, err := Parse("range.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Launch("allreduce", "oneshot"); got != c.want {
			t.Errorf("%s: launch %+v, want %+v", c.launch, got, c.want)
		}
	}
}

// TestSizeBounds: ParseSize's overflow checks at their bounds, and
// FormatSize's choice of unit.
func TestSizeBounds(t *testing.T) {
	for in, want := range map[string]int64{
		"9007199254740991KiB": 9007199254740991 << 10, // the largest KiB count
		"9223372036854775807": 1<<63 - 1,
		"8589934591GiB":       8589934591 << 30,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"9007199254740992KiB", "8589934592GiB", "8388608TiB", "16777216TiB", "9223372036854775808"} {
		if _, err := ParseSize(in); !errors.Is(err, ErrSizeTooLarge) {
			t.Errorf("ParseSize(%q): %v, want ErrSizeTooLarge", in, err)
		}
	}
	if _, err := ParseSize("8388607TiB"); err == nil || !strings.Contains(err.Error(), "write 8589933568GiB") {
		t.Errorf("ParseSize(8388607TiB): %v; want it written in GiB", err)
	}
	for n, want := range map[int64]string{512 << 20: "512MiB", 1536 << 20: "1536MiB", 512: "512B", 1<<30 + 1<<10: "1048577KiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}
