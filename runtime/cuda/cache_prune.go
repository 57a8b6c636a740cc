package cuda

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Nothing evicts cache entries by itself: `collgen cache --prune AGE`
// (Cache.Prune) removes those unused for AGE. An entry's modification
// time is its last use: Put writes it and a Get that hits moves it to now
// once it is touchAfter old (best effort: a shared cache's entries written
// by another user keep that user's times, as only the owner may set them).

// touchAfter is how stale an entry's time may get before a hit renews it:
// a New that hits 147 entries then costs no writes, and Prune's ages are
// days.
const touchAfter = time.Hour

// touch marks k's entry used now if its time is touchAfter old.
func (c *Cache) touch(k CacheKey) {
	p := c.Path(k)
	if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) > touchAfter {
		now := time.Now()
		os.Chtimes(p, now, now)
	}
}

// CacheUsage describes the files of a cache directory.
type CacheUsage struct {
	Entries int       // compiled images (<key>.cgbin)
	Bytes   int64     // their size
	Oldest  time.Time // the least recent last use of an entry (zero with none)
	Newest  time.Time // the most recent
	Locks   int       // lock files (<key>.lock, empty)
	Temps   int       // temporary files of writes in progress or killed
}

// String is one line: entries, size, last uses, lock and temporary files.
func (u CacheUsage) String() string {
	s := fmt.Sprintf("%d entries, %s", u.Entries, formatBytes(u.Bytes))
	if u.Entries > 0 {
		s += fmt.Sprintf(", last used %s to %s", u.Oldest.Format(time.DateOnly), u.Newest.Format(time.DateOnly))
	}
	return s + fmt.Sprintf("; %d lock files, %d temporary files", u.Locks, u.Temps)
}

// formatBytes is n in B, KiB, MiB or GiB with one decimal.
func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// cacheFile is one file of the cache directory that the cache made.
type cacheFile struct {
	name string
	kind byte // 'e' entry, 'l' lock, 't' temporary
	key  CacheKey
	info fs.FileInfo
}

// files lists the cache's own files in Dir (other files are not its to
// count or remove). A missing directory is an empty cache.
func (c *Cache) files() ([]cacheFile, error) {
	ents, err := os.ReadDir(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cuda: cache: %w", err)
	}
	var out []cacheFile
	for _, e := range ents {
		f := cacheFile{name: e.Name()}
		switch {
		case strings.HasPrefix(f.name, ".tmp-"):
			f.kind = 't'
		case strings.HasSuffix(f.name, ".cgbin"):
			f.kind = 'e'
		case strings.HasSuffix(f.name, ".lock"):
			f.kind = 'l'
		default:
			continue
		}
		if f.kind != 't' {
			b, err := hex.DecodeString(strings.TrimSuffix(strings.TrimSuffix(f.name, ".cgbin"), ".lock"))
			if err != nil || len(b) != len(f.key) {
				continue
			}
			copy(f.key[:], b)
		}
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue // removed meanwhile, or not a file the cache wrote
		}
		f.info = info
		out = append(out, f)
	}
	return out, nil
}

// Usage counts the cache's files.
func (c *Cache) Usage() (CacheUsage, error) {
	fs, err := c.files()
	var u CacheUsage
	for _, f := range fs {
		u.add(f)
	}
	return u, err
}

// add counts f.
func (u *CacheUsage) add(f cacheFile) {
	switch f.kind {
	case 'e':
		u.Entries++
		u.Bytes += f.info.Size()
		t := f.info.ModTime()
		if u.Oldest.IsZero() || t.Before(u.Oldest) {
			u.Oldest = t
		}
		if t.After(u.Newest) {
			u.Newest = t
		}
	case 'l':
		u.Locks++
	case 't':
		u.Temps++
	}
}

// Prune removes the entries last used before cutoff, then every lock file
// whose entry is gone and that no one holds (a compile in progress keeps
// its lock), and temporary files older than the writes that make them
// take (those of killed processes). It returns what it removed; an entry
// another process re-creates meanwhile is simply compiled again later.
// Prune(time.Now()) empties the cache but for locks in use.
func (c *Cache) Prune(cutoff time.Time) (removed CacheUsage, err error) {
	files, err := c.files()
	if err != nil {
		return removed, err
	}
	kept := map[CacheKey]bool{}
	var errs []error
	remove := func(f cacheFile) {
		if err := os.Remove(filepath.Join(c.Dir, f.name)); err == nil {
			removed.add(f)
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, f := range files {
		switch {
		case f.kind == 'e' && f.info.ModTime().Before(cutoff):
			remove(f)
		case f.kind == 'e':
			kept[f.key] = true
		case f.kind == 't' && time.Since(f.info.ModTime()) > staleTemp:
			remove(f)
		}
	}
	for _, f := range files {
		if f.kind != 'l' || kept[f.key] {
			continue
		}
		unlock, err := c.lock(context.Background(), f.key, false)
		if err != nil {
			continue // held: a compile in progress (or no flock here)
		}
		remove(f)
		unlock()
	}
	return removed, errors.Join(errs...)
}
