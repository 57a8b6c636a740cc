package rendezvous

import (
	"context"
	"fmt"
	"strings"
)

// EnvRunID names the variable holding the run's generation: a fresh random
// id that `collgen run` (and the bench parent) give every rank of one run.
// FromEnv keys the whole store by it, so a rerun on the same store never
// adopts a previous run's keys, and shared-memory segment names carry it
// so the launcher can remove what a killed rank left.
const EnvRunID = "COLLGEN_RUN_ID"

// CheckRunID returns an error unless id is a valid run id: 8 to 16 ASCII
// letters and digits.
func CheckRunID(id string) error {
	ok := len(id) >= 8 && len(id) <= 16
	for _, c := range id {
		ok = ok && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9')
	}
	if !ok {
		return fmt.Errorf("rendezvous: %s=%q: want 8 to 16 letters and digits (collgen run sets a fresh one per run)", EnvRunID, id)
	}
	return nil
}

// RunDir is the directory a file store at dir uses for run id: a
// subdirectory per run, which the launcher removes once the run is over.
func RunDir(dir, runID string) string { return strings.TrimRight(dir, "/") + "/run-" + runID }

// Scoped returns a Store that keeps every key of s under prefix, so
// independent generations (runs) sharing one store never see each other's
// keys. Timeout errors name keys without the prefix. Closing it closes s.
func Scoped(s Store, prefix string) Store { return &scoped{s: s, p: prefix} }

type scoped struct {
	s Store
	p string
}

// strip removes the prefix from the keys a *WaitError names.
func (c *scoped) strip(err error) error {
	we, ok := err.(*WaitError)
	if !ok {
		return err
	}
	out := &WaitError{Missing: make([]string, len(we.Missing))}
	for i, k := range we.Missing {
		out.Missing[i] = strings.TrimPrefix(k, c.p)
	}
	return out
}

func (c *scoped) Set(ctx context.Context, key string, value []byte) error {
	return c.s.Set(ctx, c.p+key, value)
}

func (c *scoped) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := c.s.Get(ctx, c.p+key)
	return v, c.strip(err)
}

func (c *scoped) Wait(ctx context.Context, keys ...string) error {
	full := make([]string, len(keys))
	for i, k := range keys {
		full[i] = c.p + k
	}
	return c.strip(c.s.Wait(ctx, full...))
}

func (c *scoped) Add(ctx context.Context, key string, delta int64) (int64, error) {
	return c.s.Add(ctx, c.p+key, delta)
}

func (c *scoped) CompareAndSet(ctx context.Context, key string, old, new []byte) ([]byte, bool, error) {
	return c.s.CompareAndSet(ctx, c.p+key, old, new)
}

func (c *scoped) Delete(ctx context.Context, key string) (bool, error) {
	return c.s.Delete(ctx, c.p+key)
}

func (c *scoped) Close() error { return c.s.Close() }
