package etcdstore_test

import (
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/rendezvous/etcdstore"
)

// FuzzParseAddr feeds any text to ParseAddr as the part of an etcd:// or
// etcds:// address after the scheme (COLLGEN_STORE, --store): an error, or
// endpoints that are each http(s)://host:port with a port from 1 to 65535,
// parse as URLs to that host, and hold no credentials, and a prefix that is
// empty or starts and ends with "/".
func FuzzParseAddr(f *testing.F) {
	for _, v := range []string{etcdstore.EnvCACert, etcdstore.EnvCert, etcdstore.EnvKey, etcdstore.EnvUser, etcdstore.EnvPassword} {
		if os.Getenv(v) != "" {
			f.Skipf("%s is set", v)
		}
	}
	for _, s := range []string{"h1:2379", "h1:2379,h2:2379/jobs/x/", "[::1]:2379,[fe80::1]:2379", "/x", "h1", "::1:2379",
		"bob:pw@h1:2379", "http://h:1", "h:0", "h:65536", "h:1//", ",,h:1,/a/b", "h:+1", "h:0x10", "[::1%eth0]:1"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, rest string, secure bool) {
		cfg, err := etcdstore.ParseAddr(rest, secure)
		if err != nil {
			if cfg.Endpoints != nil || cfg.TLS != nil {
				t.Fatalf("error %v with a configuration %+v", err, cfg)
			}
			return
		}
		if len(cfg.Endpoints) == 0 {
			t.Fatalf("%q: no endpoint and no error", rest)
		}
		if secure != (cfg.TLS != nil) {
			t.Fatalf("%q, secure %v: TLS %v", rest, secure, cfg.TLS)
		}
		scheme := "http://"
		if secure {
			scheme = "https://"
		}
		for _, ep := range cfg.Endpoints {
			hp, ok := strings.CutPrefix(ep, scheme)
			if !ok {
				t.Fatalf("%q: endpoint %q lacks %s", rest, ep, scheme)
			}
			if strings.ContainsAny(hp, "@/") || strings.Contains(hp, ",") {
				t.Fatalf("%q: endpoint %q holds '@', '/' or ','", rest, ep)
			}
			_, port, err := net.SplitHostPort(hp)
			if err != nil {
				t.Fatalf("%q: endpoint %q: %v", rest, ep, err)
			}
			if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
				t.Fatalf("%q: endpoint %q: port %q", rest, ep, port)
			}
			u, err := url.Parse(ep)
			if err != nil || u.Host != hp || u.User != nil {
				t.Fatalf("%q: endpoint %q does not parse as a URL to %q: %v, %+v", rest, ep, hp, err, u)
			}
		}
		if p := cfg.Prefix; p != "" && (!strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/")) {
			t.Fatalf("%q: prefix %q", rest, p)
		}
	})
}
