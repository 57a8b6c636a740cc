//go:build linux && (amd64 || arm64)

package symm

import (
	"os"
	"testing"

	cudatmpl "github.com/collgen/collgen/templates/cuda"
)

// TestDeviceHeaderInSync: the header runtime/symm embeds is the one the
// generator renders (templates/cuda/symm.cuh.tmpl) and ships in
// generated/cuda. After editing the template, run `go run ./cmd/collgen
// generate` and copy generated/cuda/collgen_symm.cuh to runtime/symm/kernels/.
func TestDeviceHeaderInSync(t *testing.T) {
	want, err := cudatmpl.SymmHeader()
	if err != nil {
		t.Fatal(err)
	}
	if DeviceHeader != string(want) {
		t.Error("runtime/symm/kernels/collgen_symm.cuh differs from templates/cuda/symm.cuh.tmpl's rendering")
	}
	if shipped, err := os.ReadFile("../../generated/cuda/" + DeviceHeaderName); err == nil && string(shipped) != DeviceHeader {
		t.Error("generated/cuda/collgen_symm.cuh differs from runtime/symm's copy: regenerate")
	} else if err != nil {
		t.Logf("no generated tree here (%v)", err)
	}
}
