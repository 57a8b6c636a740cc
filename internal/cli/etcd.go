//go:build !noetcd

package cli

// The etcd:// and etcds:// addresses of `collgen run --store` and of the
// ranks' COLLGEN_STORE (docs/multihost.md). Build with -tags noetcd to
// leave the etcd client out (the GPU bundle does, to stay small).
import "github.com/collgen/collgen/runtime/rendezvous/etcdstore"

// The etcd addresses are checked whole before any rank starts (a missing
// port failed in every rank's Open instead).
func init() {
	storeChecks["etcd"] = func(rest string) error { _, err := etcdstore.ParseAddr(rest, false); return err }
	storeChecks["etcds"] = func(rest string) error { _, err := etcdstore.ParseAddr(rest, true); return err }
}
