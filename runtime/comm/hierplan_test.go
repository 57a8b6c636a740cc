package comm

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
)

func mustGroup(t *testing.T, ids ...string) hostLayout {
	t.Helper()
	l, err := groupHosts(ids)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestGroupHosts(t *testing.T) {
	l := mustGroup(t, "b", "a", "b", "a", "c", "c")
	if want := [][]int{{0, 2}, {1, 3}, {4, 5}}; !reflect.DeepEqual(l.hosts, want) {
		t.Fatalf("hosts = %v, want %v", l.hosts, want)
	}
	if !l.multi() || l.perHost() != 2 {
		t.Fatalf("multi = %v, perHost = %d", l.multi(), l.perHost())
	}
	// Who talks to whom: the host's ranks by local index, and the ranks of
	// one local index by host index.
	for r, want := range []struct{ intra, cross []int }{
		{[]int{0, 2}, []int{0, 1, 4}},
		{[]int{1, 3}, []int{0, 1, 4}},
		{[]int{0, 2}, []int{2, 3, 5}},
		{[]int{1, 3}, []int{2, 3, 5}},
		{[]int{4, 5}, []int{0, 1, 4}},
		{[]int{4, 5}, []int{2, 3, 5}},
	} {
		if got := l.intraPeers(r); !slices.Equal(got, want.intra) {
			t.Errorf("rank %d intra peers %v, want %v", r, got, want.intra)
		}
		if got := l.crossPeers(r); !slices.Equal(got, want.cross) {
			t.Errorf("rank %d cross peers %v, want %v", r, got, want.cross)
		}
	}
	if one := mustGroup(t, "h", "h", "h"); one.multi() || one.perHost() != 3 {
		t.Fatalf("one host: multi = %v, perHost = %d", one.multi(), one.perHost())
	}
}

func TestGroupHostsUnequal(t *testing.T) {
	_, err := groupHosts([]string{"a", "a", "b"})
	want := `comm: ranks span 2 hosts with unequal numbers of ranks: host "a" has 2 (ranks 0, 1), host "b" has 1 (rank 2); start the same number of ranks on every host (the hierarchical collectives pair ranks by local index across hosts)`
	if !errors.Is(err, ErrUnsupported) || fmt.Sprint(err) != want {
		t.Fatalf("groupHosts = %v\nwant %s", err, want)
	}
}

func TestHostID(t *testing.T) {
	t.Setenv(EnvHostID, "")
	if id, err := hostID(Config{HostID: "node7"}); err != nil || id != "node7" {
		t.Fatalf("hostID(Config.HostID) = %q, %v", id, err)
	}
	t.Setenv(EnvHostID, "fromenv")
	if id, err := hostID(Config{}); err != nil || id != "fromenv" {
		t.Fatalf("hostID(env) = %q, %v", id, err)
	}
	if _, err := hostID(Config{HostID: "bad\nid"}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "Config.HostID") {
		t.Fatalf("hostID(control character) = %v", err)
	}
	if _, err := hostID(Config{HostID: strings.Repeat("x", maxHostID+1)}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("hostID(too long) = %v", err)
	}
	t.Setenv(EnvHostID, "")
	a, err := hostID(Config{})
	if b, _ := hostID(Config{}); err != nil || a == "" || a != b {
		t.Fatalf("default hostID = %q, %q, %v; want the same non-empty id", a, b, err)
	}
}

// simRank is one simulated rank's buffers.
type simRank struct{ in, out, tmp []float64 }

func (s *simRank) buf(b bufID) []float64 {
	switch b {
	case bufIn:
		return s.in
	case bufOut:
		return s.out
	}
	return s.tmp
}

// simulate runs every rank's hierarchical plan in lockstep on the CPU: a
// copy step on each rank, an intra or cross step as the collective over
// each sub-group (members ranked as the real sub-communicators rank them).
// Each step reads every member's input before writing any output, as a
// collective may run in place.
func simulate(t *testing.T, l hostLayout, collective coll.Collective, count int64, ranks []*simRank) {
	t.Helper()
	plans := make([][]hierStep, len(ranks))
	for r := range ranks {
		var tmp int64
		plans[r], tmp = hierPlan(l, r, collective, count)
		ranks[r].tmp = make([]float64, tmp)
	}
	for i := range plans[0] {
		st := plans[0][i]
		var groups [][]int
		switch st.scope {
		case scopeCopy:
			for r, rk := range ranks {
				s := plans[r][i]
				copy(rk.buf(s.dst.buf)[s.dst.off:s.dst.off+s.count], rk.buf(s.src.buf)[s.src.off:s.src.off+s.count])
			}
			continue
		case scopeIntra:
			groups = l.hosts
		case scopeCross:
			for li := range l.perHost() {
				groups = append(groups, l.crossPeers(l.hosts[0][li]))
			}
		}
		for _, g := range groups {
			w, c := int64(len(g)), st.count
			read := func(r int, n int64) []float64 {
				s := plans[r][i]
				return slices.Clone(ranks[r].buf(s.src.buf)[s.src.off : s.src.off+n])
			}
			write := func(r int, v []float64) {
				s := plans[r][i]
				copy(ranks[r].buf(s.dst.buf)[s.dst.off:], v)
			}
			var results [][]float64
			switch st.collective {
			case coll.AllReduce, coll.ReduceScatter:
				n := c
				if st.collective == coll.ReduceScatter {
					n = w * c
				}
				sum := make([]float64, n)
				for _, r := range g {
					for j, v := range read(r, n) {
						sum[j] += v
					}
				}
				for k := range g {
					if st.collective == coll.AllReduce {
						results = append(results, sum)
					} else {
						results = append(results, sum[int64(k)*c:int64(k+1)*c])
					}
				}
			case coll.AllGather:
				var all []float64
				for _, r := range g {
					all = append(all, read(r, c)...)
				}
				for range g {
					results = append(results, all)
				}
			}
			for k, r := range g {
				write(r, results[k])
			}
		}
	}
}

// TestHierPlanComputesCollectives executes the plan for fixed layouts
// (contiguous, interleaved, one rank per host, shuffled) and checks every
// rank's output against the collective's definition, in and out of place.
func TestHierPlanComputesCollectives(t *testing.T) {
	for _, ids := range [][]string{
		{"a", "a", "b", "b"},
		{"a", "b", "a", "b"},
		{"a", "b", "c"},
		{"b", "a", "a", "b"},
		{"x", "y", "z", "x", "y", "z"},
		{"p", "p", "p", "q", "q", "q"},
	} {
		checkHierLayout(t, ids, 3)
	}
}

// FuzzHierPlan is TestHierPlanComputesCollectives for any layout: 2 to 12
// ranks on equal hosts in any order, any count (per local rank for
// all-reduce).
func FuzzHierPlan(f *testing.F) {
	f.Add(uint8(4), uint8(2), uint8(3), []byte{1, 0, 3, 2})
	f.Add(uint8(12), uint8(3), uint8(1), []byte{5, 9, 2, 11, 0, 7})
	f.Fuzz(func(t *testing.T, w, hosts, k uint8, perm []byte) {
		W := 2 + int(w)%11
		H := 1 + int(hosts)%W // the largest divisor of W at most this
		for W%H != 0 {
			H--
		}
		ids := make([]string, W)
		for r := range ids {
			ids[r] = fmt.Sprintf("h%d", r%H)
		}
		for i, p := range perm { // shuffle the ranks over the hosts
			j := int(p) % W
			ids[i%W], ids[j] = ids[j], ids[i%W]
		}
		checkHierLayout(t, ids, 1+int64(k)%5)
	})
}

// checkHierLayout executes the plan of every collective for the layout of
// host ids (by rank) with k elements per local rank, in and out of place,
// and checks every rank's output against the collective's definition.
func checkHierLayout(t *testing.T, ids []string, k int64) {
	t.Helper()
	l := mustGroup(t, ids...)
	W, L := int64(len(ids)), int64(l.perHost())
	for _, collective := range []coll.Collective{coll.AllReduce, coll.ReduceScatter, coll.AllGather} {
		for _, inPlace := range []bool{false, true} {
			name := fmt.Sprintf("%s/%s/inplace=%v", strings.Join(ids, ""), collective, inPlace)
			count := k * L // all-reduce elements divide by L
			inN, outN := count, count
			switch collective {
			case coll.ReduceScatter:
				inN = W * count
			case coll.AllGather:
				outN = W * count
			}
			ranks := make([]*simRank, W)
			value := func(r, i int64) float64 { return float64(r*1000 + i + 1) }
			for r := range W {
				rk := &simRank{in: make([]float64, inN), out: make([]float64, outN)}
				for i := range inN {
					rk.in[i] = value(r, i)
				}
				if inPlace {
					switch collective {
					case coll.AllReduce:
						rk.out = rk.in
					case coll.ReduceScatter:
						rk.out = rk.in[r*count : (r+1)*count]
					case coll.AllGather:
						rk.out = make([]float64, outN)
						copy(rk.out[r*count:], rk.in)
						rk.in = rk.out[r*count : (r+1)*count]
					}
				}
				ranks[r] = rk
			}
			simulate(t, l, collective, count, ranks)
			for r := range W {
				for i := range outN {
					var want float64
					switch collective {
					case coll.AllReduce:
						for q := range W {
							want += value(q, i)
						}
					case coll.ReduceScatter:
						for q := range W {
							want += value(q, r*count+i)
						}
					case coll.AllGather:
						want = value(i/count, i%count)
					}
					if got := ranks[r].out[i]; got != want {
						t.Fatalf("%s: rank %d out[%d] = %v, want %v", name, r, i, got, want)
					}
				}
			}
		}
	}
}

// TestHierPlanTraffic: the inter-host step of every collective moves 1/L
// of the message per rank (all-reduce c = n/L; reduce-scatter and
// all-gather H blocks of the per-rank count).
func TestHierPlanTraffic(t *testing.T) {
	l := mustGroup(t, "a", "a", "a", "a", "b", "b", "b", "b")
	for _, c := range []struct {
		collective coll.Collective
		count      int64
		cross      int64
	}{
		{coll.AllReduce, 64, 16},
		{coll.ReduceScatter, 8, 8},
		{coll.AllGather, 8, 8},
	} {
		steps, _ := hierPlan(l, 5, c.collective, c.count)
		n := 0
		for _, s := range steps {
			if s.scope == scopeCross {
				n++
				if s.count != c.cross || s.collective != c.collective {
					t.Errorf("%s: cross step %v %d, want %v %d", c.collective, s.collective, s.count, c.collective, c.cross)
				}
			}
		}
		if n != 1 {
			t.Errorf("%s: %d cross steps, want 1", c.collective, n)
		}
	}
}

// intraPeers returns the ranks of rank r's host, by local index.
func (l hostLayout) intraPeers(r int) []int { return l.hosts[l.host[r]] }

// crossPeers returns the ranks sharing rank r's local index, by host index.
func (l hostLayout) crossPeers(r int) []int {
	out := make([]int, len(l.hosts))
	for h, ranks := range l.hosts {
		out[h] = ranks[l.local[r]]
	}
	return out
}
