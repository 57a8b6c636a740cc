package cuda

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The testdata fatbins were built from testdata/tiny.cu with nvcc 11.8:
//
//	nvcc -fatbin -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=compute_90 -o tiny_sm80_ptx90.fatbin tiny.cu
//	nvcc -fatbin -gencode arch=compute_80,code=sm_80 -o tiny_sm80.fatbin tiny.cu
//
// They are embedded, so the test binary runs from any directory (the GPU
// bundle's tests/gpu/run.sh runs it from the repository root).
//
//go:embed testdata/tiny_sm80_ptx90.fatbin
var tinySM80PTX90 []byte

//go:embed testdata/tiny_sm80.fatbin
var tinySM80Only []byte

func TestFatbinCodes(t *testing.T) {
	for file, tc := range map[string]struct {
		img  []byte
		want []FatbinCode
	}{
		"tiny_sm80_ptx90.fatbin": {tinySM80PTX90, []FatbinCode{{Arch: 80}, {Arch: 90, PTX: true}}},
		"tiny_sm80.fatbin":       {tinySM80Only, []FatbinCode{{Arch: 80}}},
	} {
		img, want := tc.img, tc.want
		got, err := FatbinCodes(img)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, %v; want %v", file, got, err, want)
		}
		if _, err := FatbinCodes(img[:40]); err == nil {
			t.Errorf("%s cut to 40 bytes: no error", file)
		}
	}
	if _, err := FatbinCodes([]byte("\x7fELF not a fatbin, a cubin")); !errors.Is(err, errNotFatbin) {
		t.Errorf("cubin: %v, want errNotFatbin", err)
	}
}

func TestFatbinCodeRuns(t *testing.T) {
	for _, tc := range []struct {
		code FatbinCode
		arch int
		want bool
	}{
		{FatbinCode{Arch: 90}, 90, true},
		{FatbinCode{Arch: 80}, 86, true},  // same major, lower minor
		{FatbinCode{Arch: 80}, 90, false}, // a cubin never runs on a newer major
		{FatbinCode{Arch: 90}, 80, false},
		{FatbinCode{Arch: 80, PTX: true}, 100, true}, // PTX is compiled for newer devices
		{FatbinCode{Arch: 100, PTX: true}, 90, false},
	} {
		if got := tc.code.Runs(tc.arch); got != tc.want {
			t.Errorf("%v on sm_%d: %v, want %v", tc.code, tc.arch, got, tc.want)
		}
	}
}

// TestFatbinMismatchError: a fatbin the driver refuses for lack of code is
// a *FatbinError listing what it holds, the device's architecture and the
// command that builds one that fits, over the driver's error; a fatbin
// that does hold usable code (refused for another reason) is not.
func TestFatbinMismatchError(t *testing.T) {
	img := tinySM80Only
	cause := errors.New("CUDA_ERROR_NO_BINARY_FOR_GPU")
	fe := fatbinMismatch("k.fatbin", img, 1, 90, cause)
	if fe == nil {
		t.Fatal("no FatbinError for an sm_80-only fatbin on sm_90")
	}
	msg := fe.Error()
	for _, want := range []string{"k.fatbin", "device 1 (sm_90)", "holds sm_80", "collgen fatbin --arch sm_90", "NVRTC"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if !errors.Is(fe, cause) {
		t.Error("FatbinError does not unwrap to the driver's error")
	}
	if fe := fatbinMismatch("k.fatbin", img, 0, 86, cause); fe != nil {
		t.Errorf("sm_80 code on sm_86 reported as a mismatch: %v", fe)
	}
	if fe := fatbinMismatch("k.cubin", []byte("\x7fELF"), 0, 90, cause); fe != nil {
		t.Errorf("a non-fatbin reported as a mismatch: %v", fe)
	}
}

// TestFatbinCodesHugeSizes: a block or entry size near 2^64 (a corrupt or
// hostile fatbin) is an error, never a hang or a panic: the sizes must not
// wrap around when added to an offset.
func TestFatbinCodesHugeSizes(t *testing.T) {
	le := binary.LittleEndian
	block := func(size uint64, body []byte) []byte {
		b := make([]byte, 16, 16+len(body))
		le.PutUint32(b, fatbinMagic)
		le.PutUint16(b[6:], 16)
		le.PutUint64(b[8:], size)
		return append(b, body...)
	}
	entry := func(psize uint64) []byte {
		e := make([]byte, 64)
		le.PutUint16(e, 2)
		le.PutUint32(e[4:], 32)
		le.PutUint64(e[8:], psize)
		le.PutUint32(e[28:], 90)
		return e
	}
	for name, img := range map[string][]byte{
		"block size wraps to 0":       block(1<<64-16, nil),
		"entry size wraps to itself":  block(64, entry(1<<64-32)),
		"entry size wraps backwards":  block(64, entry(1<<64-100)),
		"entry size wraps near start": block(64, entry(1<<64-48)),
	} {
		done := make(chan error, 1)
		go func() {
			defer func() {
				if p := recover(); p != nil {
					done <- fmt.Errorf("panic: %v", p)
				}
			}()
			_, err := FatbinCodes(img)
			if err == nil {
				err = errors.New("no error")
			} else {
				err = nil
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v, want an error", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: FatbinCodes still running after 5 s", name)
		}
	}
}
