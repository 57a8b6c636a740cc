//go:build !noetcd

package cli

// The etcd:// and etcds:// addresses of `collgen run --store` and of the
// ranks' COLLGEN_STORE (docs/multihost.md). Build with -tags noetcd to
// leave the etcd client out (the GPU bundle does, to stay small).
import _ "github.com/collgen/collgen/runtime/rendezvous/etcdstore"
