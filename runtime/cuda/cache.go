package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// EnvCacheDir overrides the NVRTC cache directory.
const EnvCacheDir = "COLLGEN_CACHE_DIR"

// Cache is an on-disk cache of NVRTC output, one file per compile keyed by
// a sha256 of everything that determines the output (see Key). Files are
// written to a temporary name in Dir and renamed into place, so concurrent
// processes filling the same cache never expose a partial file (one a
// killed process left is removed by a later process's first Put); a file
// that fails its checks (bad magic, other key, bad length or checksum) is
// treated as a miss and rewritten. Safe for concurrent use; use a *Cache.
type Cache struct {
	Dir string // the cache's directory, created by the first Put

	hits, misses, corrupt atomic.Int64
}

// CacheStats counts lookups since the Cache was made.
type CacheStats struct {
	Hits    int64 // valid entries returned
	Misses  int64 // no entry
	Corrupt int64 // an entry existed but failed validation (rebuilt)
}

// Stats returns the lookup counters.
func (c *Cache) Stats() CacheStats {
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Corrupt: c.corrupt.Load()}
}

// DefaultCacheDir is $COLLGEN_CACHE_DIR, else $XDG_CACHE_HOME/collgen (an
// absolute one; a relative one is ignored, as the XDG spec says), else
// ~/.cache/collgen. A leading ~ in $COLLGEN_CACHE_DIR is the home
// directory (no shell expands an env file's value), and a relative one is
// made absolute, so a later chdir does not move the cache.
func DefaultCacheDir() (string, error) {
	if d := os.Getenv(EnvCacheDir); d != "" {
		if d == "~" || strings.HasPrefix(d, "~/") {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("cuda: $%s=%s: %w", EnvCacheDir, d, err)
			}
			d = filepath.Join(home, d[1:])
		}
		abs, err := filepath.Abs(d)
		if err != nil {
			return "", fmt.Errorf("cuda: $%s=%s: %w", EnvCacheDir, d, err)
		}
		return abs, nil
	}
	base, err := os.UserCacheDir() // $XDG_CACHE_HOME or ~/.cache
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" && !filepath.IsAbs(x) {
		// The XDG base directory spec makes a relative path invalid, to
		// be ignored (os.UserCacheDir refuses it): ~/.cache.
		var home string
		if home, err = os.UserHomeDir(); err == nil {
			base = filepath.Join(home, ".cache")
		}
	}
	if err != nil {
		return "", fmt.Errorf("cuda: no cache directory: %w", err)
	}
	return filepath.Join(base, "collgen"), nil
}

// DefaultCache returns a Cache in DefaultCacheDir.
func DefaultCache() (*Cache, error) {
	d, err := DefaultCacheDir()
	if err != nil {
		return nil, err
	}
	return &Cache{Dir: d}, nil
}

// CacheKey identifies one compile.
type CacheKey [32]byte

// String returns the key in hex, as used in cache file names.
func (k CacheKey) String() string { return hex.EncodeToString(k[:]) }

// Key hashes everything that determines NVRTC's output for req:
//
//   - the program's name, source and headers (sorted by name);
//   - the effective options, which name the target architecture
//     (--gpu-architecture=sm_90 gives a CUBIN for that architecture only,
//     compute_90 PTX), and req.Arch;
//   - the compiler: NVRTC's major.minor version and the build of its
//     library file (libraryBuild: real path, size and modification time),
//     so two builds of one major.minor (a toolkit update such as 13.0 Update
//     1, a patched libnvrtc) never answer for each other. It is read once,
//     when NVRTC is loaded (a stat, no hashing of the 60 MB file).
//
// Whether an entry is a CUBIN or PTX is not a part: it follows from the
// options and the NVRTC build, which are. Neither is the driver version:
// NVRTC's output does not depend on it, a CUBIN is loaded as is, and PTX
// is JIT-compiled by the driver at load time, after the cache (a driver too
// old for the PTX fails the same way for a fresh compile). Key loads NVRTC;
// one whose file cannot be found has no key.
func (c *Cache) Key(req CompileRequest) (CacheKey, error) {
	compiler, err := nvrtcCompiler()
	if err != nil {
		return CacheKey{}, err
	}
	return c.keyFor(req, compiler), nil
}

// nvrtcName is the compiler part of the key of NVRTC major.minor whose
// library is build (libraryBuild).
func nvrtcName(major, minor int, build string) string {
	return fmt.Sprintf("nvrtc %d.%d %s", major, minor, build)
}

// libraryBuild identifies the build of the shared library file: its real
// path (symbolic links resolved, so libnvrtc.so.13 becomes the
// libnvrtc.so.13.0.88 it points to), size and modification time in
// nanoseconds. Two builds of a library differ in at least one of them; a
// reinstall of one build may differ too, which costs one compile of each
// program. "" when file is "" or cannot be read.
func libraryBuild(file string) string {
	if file == "" {
		return ""
	}
	real, err := filepath.EvalSymlinks(file)
	if err == nil {
		real, err = filepath.Abs(real)
	}
	if err != nil {
		return ""
	}
	st, err := os.Stat(real)
	if err != nil || !st.Mode().IsRegular() {
		return ""
	}
	return fmt.Sprintf("%s size %d mtime %d", real, st.Size(), st.ModTime().UnixNano())
}

// keyFor is Key for the compiler named by compiler (its name and version).
func (c *Cache) keyFor(req CompileRequest, compiler string) CacheKey {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field("collgen-nvrtc-cache-v1")
	field(req.Name)
	field(req.Source)
	names := make([]string, 0, len(req.Headers))
	for n := range req.Headers {
		names = append(names, n)
	}
	sort.Strings(names)
	field(strconv.Itoa(len(names)))
	for _, n := range names {
		field(n)
		field(req.Headers[n])
	}
	opts := effectiveOptions(req)
	field(strconv.Itoa(len(opts)))
	for _, o := range opts {
		field(o)
	}
	field(strconv.Itoa(req.Arch))
	field(compiler)
	var k CacheKey
	h.Sum(k[:0])
	return k
}

// Cache file layout (little endian):
//
//	magic   [8]byte "CGNVRTC1"
//	key     [32]byte the CacheKey this file answers
//	kind    uint32   1 = CUBIN, 2 = PTX
//	_       uint32
//	length  uint64   payload bytes
//	sum     [32]byte sha256 of the payload
//	payload [length]byte
var cacheMagic = [8]byte{'C', 'G', 'N', 'V', 'R', 'T', 'C', '1'}

const (
	cacheHeaderSize = 8 + 32 + 4 + 4 + 8 + 32
	kindCUBIN       = 1
	kindPTX         = 2
)

// Path returns the file that holds key.
func (c *Cache) Path(k CacheKey) string { return filepath.Join(c.Dir, k.String()+".cgbin") }

// errCorrupt marks a cache file that failed validation.
var errCorrupt = errors.New("corrupt cache entry")

// Get returns the cached image for k. ok is false on a miss or an invalid
// file (counted as Corrupt; the caller rebuilds and Puts over it).
func (c *Cache) Get(k CacheKey) (image []byte, ok bool) {
	img, err := c.lookup(k)
	c.count(err)
	return img, err == nil
}

// lookup reads and checks k's entry without counting: errCorrupt for an
// invalid file, the read's error for none. A valid entry is marked used
// (touch), for Prune.
func (c *Cache) lookup(k CacheKey) ([]byte, error) {
	data, err := os.ReadFile(c.Path(k))
	if err != nil {
		return nil, err
	}
	img, err := decodeEntry(k, data)
	if err == nil {
		c.touch(k)
	}
	return img, err
}

// count records one lookup's outcome (lookup's error) in the stats.
func (c *Cache) count(err error) {
	switch {
	case err == nil:
		c.hits.Add(1)
	case errors.Is(err, errCorrupt):
		c.corrupt.Add(1)
	default:
		c.misses.Add(1)
	}
}

func decodeEntry(k CacheKey, data []byte) ([]byte, error) {
	if len(data) < cacheHeaderSize || !bytes.Equal(data[:8], cacheMagic[:]) {
		return nil, errCorrupt
	}
	if !bytes.Equal(data[8:40], k[:]) {
		return nil, errCorrupt // a foreign file under this name
	}
	kind := binary.LittleEndian.Uint32(data[40:44])
	n := binary.LittleEndian.Uint64(data[48:56])
	payload := data[cacheHeaderSize:]
	if (kind != kindCUBIN && kind != kindPTX) || n != uint64(len(payload)) {
		return nil, errCorrupt
	}
	sum := sha256.Sum256(payload)
	if !bytes.Equal(sum[:], data[56:88]) {
		return nil, errCorrupt
	}
	return payload, nil
}

// Put stores image under k: written to a temporary file in Dir, synced,
// then renamed over the final name (atomic on POSIX filesystems). The
// entry is readable by all (0644), so users sharing Dir share entries.
func (c *Cache) Put(k CacheKey, image []byte) error {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return fmt.Errorf("cuda: cache: %w", err)
	}
	kind := uint32(kindCUBIN)
	if isPTX(image) {
		kind = kindPTX
	}
	hdr := make([]byte, cacheHeaderSize)
	copy(hdr[:8], cacheMagic[:])
	copy(hdr[8:40], k[:])
	binary.LittleEndian.PutUint32(hdr[40:44], kind)
	binary.LittleEndian.PutUint64(hdr[48:56], uint64(len(image)))
	sum := sha256.Sum256(image)
	copy(hdr[56:88], sum[:])

	tmp, err := os.CreateTemp(c.Dir, ".tmp-"+k.String()[:16]+"-*")
	if err != nil {
		return fmt.Errorf("cuda: cache: %w", err)
	}
	name := tmp.Name()
	// CreateTemp makes the file 0600: other users of a shared cache could
	// not read the entry, and would compile it again and rename theirs
	// over it. Entries are 0644, as the lock files are.
	err = tmp.Chmod(0o644)
	if err == nil {
		_, err = tmp.Write(hdr)
	}
	if err == nil {
		_, err = tmp.Write(image)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(name, c.Path(k))
	}
	if err != nil {
		os.Remove(name)
		return fmt.Errorf("cuda: cache put %s: %w", k, err)
	}
	c.removeStaleTemps()
	return nil
}

// staleTemp is the age past which a temporary file of Put is taken for one
// a killed process left: a Put takes milliseconds.
const staleTemp = 10 * time.Minute

// sweptDirs are the cache directories whose stale temporary files this
// process has removed: once a process is enough (they are left by dead
// processes), and a cold build's hundreds of Puts read the directory once.
var sweptDirs sync.Map

// removeStaleTemps removes the temporary files in Dir older than staleTemp
// (a process killed inside Put leaves one), on this process's first Put
// there. Best effort.
func (c *Cache) removeStaleTemps() {
	if _, done := sweptDirs.LoadOrStore(c.Dir, true); done {
		return
	}
	ents, _ := os.ReadDir(c.Dir) // not Glob: Dir may hold glob metacharacters
	const prefix = ".tmp-"
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if st, err := e.Info(); err == nil && time.Since(st.ModTime()) > staleTemp {
			os.Remove(filepath.Join(c.Dir, e.Name()))
		}
	}
}

// isPTX reports whether image looks like PTX text rather than an ELF cubin
// or a fatbin.
func isPTX(image []byte) bool {
	return !bytes.HasPrefix(image, []byte("\x7fELF")) && !bytes.HasPrefix(image, []byte{0x50, 0xed, 0x55, 0xba}) &&
		bytes.Contains(image[:min(len(image), 4096)], []byte(".version"))
}

// KernelSource says where a module's code may come from: a prebuilt fatbin
// (embedded bytes, or a file from `make fatbin`) is preferred; the CUDA
// source is compiled with NVRTC when there is no fatbin, the file does not
// exist, or the fatbin has no code for the device.
type KernelSource struct {
	Fatbin     []byte         // embedded fatbin image, if any
	FatbinPath string         // fatbin file, used when Fatbin is empty
	Source     CompileRequest // NVRTC fallback; empty Source means none
}
