package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// testEntry builds a cache file as the format comment of cacheHeaderSize
// lays it out (magic, key, kind, 4 reserved bytes, payload size, payload
// SHA-256, payload), independently of Put.
func testEntry(k CacheKey, kind uint32, image []byte) []byte {
	b := append([]byte{}, cacheMagic[:]...)
	b = append(b, k[:]...)
	b = binary.LittleEndian.AppendUint32(b, kind)
	b = append(b, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(image)))
	sum := sha256.Sum256(image)
	b = append(b, sum[:]...)
	return append(b, image...)
}

// FuzzCacheEntry feeds any bytes to the kernel cache's entry decoder, as
// Get does with a file of a shared cache directory: errCorrupt, or the
// payload after the header. An entry built for an image decodes to it
// under its key only; with any header or payload byte changed (the kind
// and reserved bytes aside), cut short or lengthened it is errCorrupt.
func FuzzCacheEntry(f *testing.F) {
	k := CacheKey(sha256.Sum256([]byte("key")))
	f.Add(testEntry(k, kindCUBIN, []byte("\x7fELF cubin")), []byte("\x7fELF cubin"), uint16(0))
	f.Add(testEntry(k, kindPTX, []byte(".version 8.0\n")), []byte(".version 8.0\n"), uint16(100))
	f.Add(testEntry(k, 3, nil), []byte{}, uint16(41))
	f.Add(testEntry(CacheKey{}, kindCUBIN, []byte("x")), []byte("x"), uint16(9))
	f.Add([]byte("CGNVRTC1"), []byte(nil), uint16(7))
	f.Fuzz(func(t *testing.T, data, image []byte, pos uint16) {
		img, err := decodeEntry(k, data)
		switch {
		case err != nil && !errors.Is(err, errCorrupt):
			t.Fatalf("error %v is not errCorrupt", err)
		case err != nil && img != nil:
			t.Fatalf("errCorrupt with %d bytes", len(img))
		case err == nil && (len(data) < cacheHeaderSize || !bytes.Equal(img, data[cacheHeaderSize:])):
			t.Fatalf("accepted %d bytes as a %d-byte image that is not what follows the header", len(data), len(img))
		}

		for _, kind := range []uint32{kindCUBIN, kindPTX} {
			e := testEntry(k, kind, image)
			if got, err := decodeEntry(k, e); err != nil || !bytes.Equal(got, image) {
				t.Fatalf("entry of a %d-byte image (kind %d): %v", len(image), kind, err)
			}
			if _, err := decodeEntry(CacheKey(sha256.Sum256(e)), e); !errors.Is(err, errCorrupt) {
				t.Fatalf("entry decoded under another key: %v", err)
			}
			if _, err := decodeEntry(k, e[:len(e)-1]); !errors.Is(err, errCorrupt) {
				t.Fatalf("entry cut short by a byte: %v", err)
			}
			if _, err := decodeEntry(k, append(e, 0)); !errors.Is(err, errCorrupt) {
				t.Fatalf("entry with a byte more: %v", err)
			}
			p := int(pos) % len(e)
			if p >= 40 && p < 48 {
				continue // kind and reserved
			}
			bad := bytes.Clone(e)
			bad[p] ^= 0x5a
			if _, err := decodeEntry(k, bad); !errors.Is(err, errCorrupt) {
				t.Fatalf("entry with byte %d of %d changed: %v", p, len(e), err)
			}
		}
	})
}

// FuzzFatbinCodes feeds any bytes to FatbinCodes, as a load that the
// driver refused does with a user's --fatbin file: it returns (without
// looping or panicking) an error, or codes of at most one per 32 bytes
// of a file that starts with the fatbin magic (or none of an empty one);
// fatbinMismatch on the same bytes agrees.
func FuzzFatbinCodes(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.fatbin")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b, 90)
		}
	}
	f.Add([]byte("\x7fELF not a fatbin"), 80)
	f.Add([]byte{}, 90)
	f.Add([]byte{0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 90)
	f.Fuzz(func(t *testing.T, image []byte, arch int) {
		codes, err := FatbinCodes(image)
		if err != nil {
			if codes != nil {
				t.Fatalf("error %v with codes %v", err, codes)
			}
			if fe := fatbinMismatch("fuzz", image, 0, arch, errors.New("driver")); fe != nil {
				t.Fatalf("fatbinMismatch of an image FatbinCodes refused: %v", fe)
			}
			return
		}
		if len(image) > 0 && (len(image) < 16 || binary.LittleEndian.Uint32(image) != fatbinMagic) {
			t.Fatalf("codes %v from an image without the fatbin magic", codes)
		}
		if len(codes) > len(image)/32 {
			t.Fatalf("%d codes from %d bytes", len(codes), len(image))
		}
		runs := false
		for _, c := range codes {
			_ = c.String()
			runs = runs || c.Runs(arch)
		}
		fe := fatbinMismatch("fuzz", image, 0, arch, errors.New("driver"))
		if (fe == nil) != runs {
			t.Fatalf("codes %v, arch %d: runs %v but fatbinMismatch %v", codes, arch, runs, fe)
		}
		if fe != nil {
			_ = fe.Error()
		}
	})
}
