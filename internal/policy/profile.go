package policy

import (
	"sort"
	"sync"
	"time"
)

// Profile records the distinct names seen in passive mode, bounded in memory:
// once Limit names are held, further new names are only counted.
type Profile struct {
	limit int

	mu      sync.Mutex
	names   map[string]*ProfileEntry
	dropped uint64 // new names not recorded because the profile was full
}

// ProfileEntry is one recorded name.
type ProfileEntry struct {
	Name string `json:"name"`
	// Listed is true when the name was already allowlisted when last seen.
	Listed    bool      `json:"listed"`
	Count     uint64    `json:"count"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// ProfileSnapshot is a copy of a profile, sorted by name.
type ProfileSnapshot struct {
	Entries []ProfileEntry `json:"entries"`
	Dropped uint64         `json:"dropped"`
	Limit   int            `json:"limit"`
}

// NewProfile returns an empty profile holding at most limit names (0: 10000).
func NewProfile(limit int) *Profile {
	if limit <= 0 {
		limit = 10000
	}
	return &Profile{limit: limit, names: map[string]*ProfileEntry{}}
}

// Record notes one sighting of name.
func (p *Profile) Record(name string, listed bool, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.names[name]; ok {
		e.Count++
		e.Listed = listed
		e.LastSeen = now
		return
	}
	if len(p.names) >= p.limit {
		p.dropped++
		return
	}
	p.names[name] = &ProfileEntry{Name: name, Listed: listed, Count: 1, FirstSeen: now, LastSeen: now}
}

// Snapshot copies the profile.
func (p *Profile) Snapshot() ProfileSnapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := ProfileSnapshot{Dropped: p.dropped, Limit: p.limit, Entries: make([]ProfileEntry, 0, len(p.names))}
	for _, e := range p.names {
		s.Entries = append(s.Entries, *e)
	}
	sort.Slice(s.Entries, func(i, j int) bool { return s.Entries[i].Name < s.Entries[j].Name })
	return s
}

// Clear forgets everything.
func (p *Profile) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.names = map[string]*ProfileEntry{}
	p.dropped = 0
}
