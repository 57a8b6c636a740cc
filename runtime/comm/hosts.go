package comm

import (
	"fmt"
	"os"
	"strings"
)

// EnvHostID overrides the host identity of every rank of a process (as
// Config.HostID does for one communicator): ranks with the same id count
// as one host, whose GPUs reach each other by CUDA IPC. Tests use it to
// make two "hosts" on one machine.
const EnvHostID = "COLLGEN_HOST_ID"

// maxHostID bounds a host id, so a stray value cannot bloat the store.
const maxHostID = 256

// bootIDPath holds the kernel's boot id: hostname plus boot id names one
// running machine (two containers with the same hostname on different
// machines differ; a rebooted machine is a new host).
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// hostID returns this rank's host identity: Config.HostID, else
// $COLLGEN_HOST_ID, else the hostname and the boot id.
func hostID(cfg Config) (string, error) {
	id, from := cfg.HostID, "Config.HostID"
	if id == "" {
		id, from = os.Getenv(EnvHostID), EnvHostID
	}
	if id != "" {
		if len(id) > maxHostID || strings.ContainsFunc(id, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return "", errorf(ErrInvalidArgument, "comm: %s %.40q: want at most %d printable characters", from, id, maxHostID)
		}
		return id, nil
	}
	name, err := os.Hostname()
	if err != nil {
		return "", errorf(ErrUnsupported, "comm: cannot name this host (set %s or Config.HostID): %w", EnvHostID, err)
	}
	boot, err := os.ReadFile(bootIDPath)
	if err != nil {
		// Not Linux: the hostname alone.
		return name, nil
	}
	return name + "/" + strings.TrimSpace(string(boot)), nil
}

// hostLayout groups a world's ranks by host. Every rank builds it from the
// same all-gathered ids (membership), so every rank sees the same layout.
//
//	hosts[h]  the ranks of host h, ascending; hosts ordered by lowest rank
//	host[r]   rank r's host index h
//	local[r]  rank r's index within hosts[h] (its local index)
//
// The hierarchical collectives use two kinds of sub-group: a host's ranks
// (intra, ranked by local index) and the ranks with one local index
// across hosts (cross, ranked by host index).
type hostLayout struct {
	ids   []string // by host index
	hosts [][]int
	host  []int
	local []int
}

// groupHosts builds the layout from every rank's host id (by rank). Hosts
// with different numbers of ranks are refused: the hierarchical
// collectives pair ranks by local index across hosts.
func groupHosts(ids []string) (hostLayout, error) {
	l := hostLayout{host: make([]int, len(ids)), local: make([]int, len(ids))}
	index := map[string]int{}
	for r, id := range ids {
		h, ok := index[id]
		if !ok {
			h = len(l.hosts)
			index[id] = h
			l.ids = append(l.ids, id)
			l.hosts = append(l.hosts, nil)
		}
		l.host[r], l.local[r] = h, len(l.hosts[h])
		l.hosts[h] = append(l.hosts[h], r)
	}
	for h := range l.hosts {
		if len(l.hosts[h]) != len(l.hosts[0]) {
			return hostLayout{}, errorf(ErrUnsupported, "comm: ranks span %d hosts with unequal numbers of ranks: host %q has %d (%s), host %q has %d (%s); "+
				"start the same number of ranks on every host (the hierarchical collectives pair ranks by local index across hosts)",
				len(l.hosts), l.ids[0], len(l.hosts[0]), rankList(l.hosts[0]), l.ids[h], len(l.hosts[h]), rankList(l.hosts[h]))
		}
	}
	return l, nil
}

// multi reports whether the ranks span more than one host.
func (l hostLayout) multi() bool { return len(l.hosts) > 1 }

// perHost is the number of ranks on each host (L).
func (l hostLayout) perHost() int { return len(l.hosts[0]) }

// rankList writes ranks as "ranks 0, 2" or "rank 1", eliding long lists.
func rankList(ranks []int) string {
	var b strings.Builder
	b.WriteString("rank")
	if len(ranks) > 1 {
		b.WriteString("s")
	}
	for i, r := range ranks {
		if i == 8 {
			fmt.Fprintf(&b, ", ... (%d more)", len(ranks)-i)
			break
		}
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %d", r)
	}
	return b.String()
}
