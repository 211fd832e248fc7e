package secrets

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"
)

// Policy reads instance's policy from the store now.
func (s *Store) Policy(instance string) (*Policy, error) {
	ix, err := s.load()
	if err != nil {
		return &Policy{instance: instance}, err
	}
	return policyFrom(instance, ix)
}

// Source gives a daemon its instance's current policy without reading the
// index on every request: it stats the index and rebuilds the policy when
// the file changed. Every change is an atomic rename, so a new inode says
// so even within one mtime tick. Safe for concurrent use.
type Source struct {
	store    *Store
	instance string

	used   UseMarker
	flight singleflight.Group // Value's reads in progress, by secret

	mu    sync.Mutex
	stamp stamp // of the index the policy was built from
	pol   *Policy
	err   error
}

type stamp struct {
	ino   uint64
	size  int64
	mtime time.Time
	ok    bool // the index existed
}

// Source returns a Source of instance's policy.
func (s *Store) Source(instance string) *Source {
	return &Source{store: s, instance: instance, used: UseMarker{Store: s}}
}

// Value reads secret name's value now (Store.Value): the proxy calls it
// through Apply for every request it injects, so a rotation reaches the
// next request. Concurrent reads of one secret share one read, so that a
// guest's burst of requests runs a command-backed secret's command once,
// not once per request; the read is not tied to any one request (a guest
// that drops its request does not kill a helper mid-run), only to the
// command's own timeout.
func (src *Source) Value(ctx context.Context, name string) ([]byte, error) {
	v, err, _ := src.flight.Do(name, func() (any, error) {
		return src.store.Value(context.WithoutCancel(ctx), name)
	})
	if err != nil {
		return nil, err
	}
	return slices.Clone(v.([]byte)), nil
}

// Used records the last use of names, at most once a minute per secret
// (UseMarker).
func (src *Source) Used(names []string, now time.Time) error {
	return src.used.Used(names, now)
}

// Policy returns the current policy. With an error the policy is still
// the one to use: a store that cannot be read gives one that injects
// nothing, a binding that no longer validates is left out of it.
func (src *Source) Policy() (*Policy, error) {
	st, err := statIndex(filepath.Join(src.store.Dir, indexFile))
	src.mu.Lock()
	defer src.mu.Unlock()
	if err != nil {
		return &Policy{instance: src.instance}, err
	}
	if src.pol != nil && st == src.stamp {
		return src.pol, src.err
	}
	src.pol, src.err = src.store.Policy(src.instance)
	src.stamp = st
	return src.pol, src.err
}

func statIndex(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return stamp{}, nil
	}
	if err != nil {
		return stamp{}, err
	}
	st := stamp{size: fi.Size(), mtime: fi.ModTime(), ok: true}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st, nil
}

// UseMarker records secrets' last use for abox secret list, at most once
// per Interval per secret, so a busy proxy does not write a file per
// request. Safe for concurrent use.
type UseMarker struct {
	// Store is where uses are recorded.
	Store *Store
	// Interval between two records of one secret; 0 means a minute.
	Interval time.Duration

	mu   sync.Mutex
	last map[string]time.Time // secret -> time of the last record
}

// Used records that a request at now carried the secrets names (such as
// Decision.Secrets). A failed record is returned and retried on the next
// use.
func (m *UseMarker) Used(names []string, now time.Time) error {
	iv := m.Interval
	if iv == 0 {
		iv = time.Minute
	}
	var errs []error
	for _, n := range names {
		m.mu.Lock()
		if m.last == nil {
			m.last = map[string]time.Time{}
		}
		due := now.Sub(m.last[n]) >= iv
		if due {
			m.last[n] = now
		}
		m.mu.Unlock()
		if !due {
			continue
		}
		if err := m.Store.MarkUsed(n, now); err != nil {
			m.mu.Lock()
			delete(m.last, n)
			m.mu.Unlock()
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
