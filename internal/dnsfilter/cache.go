package dnsfilter

import (
	"strconv"
	"sync"
	"time"
)

// cacheKey identifies an upstream answer. The policy is decided before the
// cache is consulted, so the key needs no policy state.
type cacheKey struct {
	name  string // normalised, no trailing dot
	qtype uint16
	do    bool
}

func (k cacheKey) String() string {
	s := k.name + "/" + strconv.Itoa(int(k.qtype))
	if k.do {
		s += "/do"
	}
	return s
}

// cache holds checked answers until they expire. It is bounded: when full,
// expired entries are swept and, failing that, an arbitrary entry is
// evicted (Go's map order is randomised, so an attacker cannot pin the
// entries of others).
type cache struct {
	mu sync.RWMutex
	m  map[cacheKey]*entry
	// max is the entry limit, > 0.
	max int
}

func newCache(n int) *cache { return &cache{m: make(map[cacheKey]*entry), max: n} }

func (c *cache) get(k cacheKey, now time.Time) *entry {
	c.mu.RLock()
	e := c.m[k]
	c.mu.RUnlock()
	if e == nil || !now.Before(e.expires) {
		return nil
	}
	return e
}

func (c *cache) put(k cacheKey, e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		now := e.stored
		for ok, ek := range c.m {
			if !now.Before(ek.expires) {
				delete(c.m, ok)
			}
		}
		for ok := range c.m {
			if len(c.m) < c.max {
				break
			}
			delete(c.m, ok)
		}
	}
	c.m[k] = e
}

func (c *cache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}
