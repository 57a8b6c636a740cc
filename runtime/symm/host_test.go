//go:build linux && (amd64 || arm64)

package symm

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// TestHostImportRefusals: Import maps only sealed memory of this user,
// mode 0600 and the expected size.
func TestHostImportRefusals(t *testing.T) {
	be := NewHostBackend()
	page := be.Granularity()
	addr, err := be.Reserve(page)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Release(addr, page)
	c, err := be.Create(addr, page)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Unmap()
	f, err := c.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := be.Import(f, page, 0)
	if err != nil {
		t.Fatalf("own export refused: %v", err)
	}
	if err := m.Unmap(); err != nil {
		t.Error(err)
	}
	if _, err := be.Import(f, 2*page, 0); err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Errorf("wrong size accepted: %v", err)
	}

	plain, err := os.CreateTemp(t.TempDir(), "unsealed")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.Truncate(int64(page)); err != nil {
		t.Fatal(err)
	}
	if _, err := be.Import(plain, page, 0); err == nil || !strings.Contains(err.Error(), "sealed") {
		t.Errorf("unsealed file accepted: %v", err)
	}
	if err := plain.Chmod(0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := be.Import(plain, page, 0); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Errorf("mode 0644 accepted: %v", err)
	}
}

// TestHostBackendRefusalsAreTyped: the host twin's own refusals of a
// caller's argument (a size that is no positive multiple of the page, a
// nil descriptor, an ordering other than Now) wrap ErrInvalidArgument,
// as the pool's do. (Before, they matched no sentinel.)
func TestHostBackendRefusalsAreTyped(t *testing.T) {
	be := NewHostBackend()
	page := be.Granularity()
	addr, err := be.Reserve(page)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Release(addr, page)
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Reserve(-1)", func() error { _, err := be.Reserve(-1); return err }},
		{"Reserve(page+1)", func() error { _, err := be.Reserve(page + 1); return err }},
		{"Create(0 bytes)", func() error { _, err := be.Create(addr, 0); return err }},
		{"Import(nil)", func() error { _, err := be.Import(nil, page, 0); return err }},
		{"Import(-page)", func() error { _, err := be.Import(os.Stdin, -page, 0); return err }},
		{"Signal(nil)", func() error { return be.Signal(nil, &SignalOp{Kind: SignalPut}) }},
	} {
		if err := c.call(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v; want ErrInvalidArgument", c.name, err)
		}
	}
}
