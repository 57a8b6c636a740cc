//go:build cgo

package cuda_test

import (
	"bytes"
	"testing"

	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/cuda/cudatest"
)

// TestVMM runs the VMM cycle runtime/symm's CUDA backend uses on one
// device: reserve, create, map, set access, write and read back, export
// as a descriptor and import it again (in this process) at a second
// address that sees the same bytes, then unmap, release and free, with
// the device's free memory back where it started.
func TestVMM(t *testing.T) {
	d := cudatest.Devices(t, 1)[0]
	ok, err := d.VMMSupported()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Skipf("%v: no VMM with POSIX descriptors", d)
	}
	g, err := d.MemGranularity(true)
	if err != nil {
		t.Fatal(err)
	}
	gmin, err := d.MemGranularity(false)
	if err != nil || gmin <= 0 || g%gmin != 0 {
		t.Fatalf("granularity: recommended %d, minimum %d, %v", g, gmin, err)
	}
	t.Logf("%v: granularity %d (minimum %d)", d, g, gmin)
	free0, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	size := 2 * g
	va, err := d.MemAddressReserve(size, 0)
	if err != nil {
		t.Fatal(err)
	}
	h, err := d.MemCreate(size)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.MemMap(va, size, h); err != nil {
		t.Fatal(err)
	}
	if err := d.MemSetAccess(va, size, d); err != nil {
		t.Fatal(err)
	}
	if dev, err := d.MemDevice(h); err != nil || dev != d.Ordinal {
		t.Errorf("MemDevice = %d, %v; want %d", dev, err, d.Ordinal)
	}
	// A second mapping of the same handle, holding no reference of its
	// own: it must keep the memory alive after the release below
	// (runtime/symm maps same-process peers this way).
	va3, err := d.MemAddressReserve(size, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.MemMap(va3, size, h); err != nil {
		t.Fatal(err)
	}
	if err := d.MemSetAccess(va3, size, d); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("vmm!"), size/4)
	if err := d.CopyHtoD(va, want); err != nil {
		t.Fatal(err)
	}
	f, err := d.MemExportFD(h)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := d.MemImportFD(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	// A larger mapping than the allocation must be refused (the backend's
	// size check relies on it).
	big, err := d.MemAddressReserve(4*g, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.MemMap(big, 4*g, h2); err == nil {
		t.Error("mapping 4 granules of a 2-granule allocation succeeded")
		d.MemUnmap(big, 4*g)
	}
	if err := d.MemMap(big, size, h2); err != nil {
		t.Fatal(err)
	}
	if err := d.MemSetAccess(big, size, d); err != nil {
		t.Fatal(err)
	}
	// The exporter lets go first; the second mapping keeps the memory.
	if err := d.MemUnmap(va, size); err != nil {
		t.Fatal(err)
	}
	if err := d.MemRelease(h); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := d.CopyDtoH(got, big); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("the imported mapping reads other bytes than were written through the first")
	}
	clear(got)
	if err := d.CopyDtoH(got, va3); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("a second mapping of the released handle reads other bytes")
	}
	for _, err := range []error{d.MemUnmap(big, size), d.MemRelease(h2), d.MemAddressFree(big, 4*g), d.MemAddressFree(va, size),
		d.MemUnmap(va3, size), d.MemAddressFree(va3, size)} {
		if err != nil {
			t.Error(err)
		}
	}
	free1, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if diff := int64(free0) - int64(free1); diff > int64(g) {
		t.Errorf("free memory %d after, %d before: %d bytes not returned", free1, free0, diff)
	}
	if _, err := d.MemCreate(1); !cuda.IsCode(err, cuda.ErrorInvalidValue) {
		t.Logf("MemCreate(1 byte): %v", err)
	}
}
