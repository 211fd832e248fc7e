package policy

import (
	"sort"
	"strings"
	"sync"
	"time"
)

// Observation is one request as the proxy decided it, in the terms of its
// decision line: what learn mode records.
type Observation struct {
	// Kind is the decision line's kind: http, inner or connect.
	Kind string
	Host string
	Port uint16
	// Method is the request's method as the guest sent it.
	Method string
	// Path is the escaped path without its query, as the decision line
	// holds it (cut at 512 bytes, ending in "…").
	Path   string
	Status int
	// Allowed is the verdict; Reason its code.
	Allowed bool
	Reason  string
	// Tunnel marks a CONNECT whose bytes the proxy does not read
	// (--no-mitm, an exception): no request of it is ever seen.
	Tunnel bool
}

// Observe records o when the instance is in learn mode and does nothing
// otherwise: the proxy calls it for every decision it logs. A nil Engine
// (a proxy built bare in a test) records nothing.
func (e *Engine) Observe(o Observation) {
	if e == nil || *e.mode.Load() != Learn {
		return // inlined: the proxy's cost outside learn mode is this test
	}
	e.observeLearning(&o)
}

func (e *Engine) observeLearning(o *Observation) { e.learned.observe(*o, e.now()) }

// Learned returns a copy of the learning record.
func (e *Engine) Learned() LearnSnapshot { return e.learned.Snapshot() }

// ClearLearned forgets the learning record.
func (e *Engine) ClearLearned() { e.learned.Clear(e.now()) }

// LearnLimits bound the learning record. A guest decides what it asks
// for, so it could otherwise grow the record without end; past a bound the
// record only counts (see LearnRecord).
type LearnLimits struct {
	// Hosts is the most host names held; 0 means 1,000.
	Hosts int
	// Requests is the most distinct (host, method, path) held over all
	// hosts; 0 means 10,000.
	Requests int
	// PerHost is the most distinct (method, path) held for one host; 0
	// means 500. A guest flooding one host with paths fills its own
	// bound, not the others'.
	PerHost int
	// Names is the most names held that were resolved or decided without
	// a request; 0 means 1,000.
	Names int
}

func (l LearnLimits) withDefaults() LearnLimits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.Hosts, 1000)
	def(&l.Requests, 10000)
	def(&l.PerHost, 500)
	def(&l.Names, 1000)
	return l
}

// maxMethodBytes cuts a method: HTTP allows any token, and the record keys
// on it.
const maxMethodBytes = 16

// maxPorts is how many distinct ports a host keeps.
const maxPorts = 8

// LearnRecord is what learn mode saw: per host, the distinct (method,
// path) pairs of the requests allowed, with counts; the codes of what was
// refused; and the names decided without a request. Queries are never
// held (the decision line has none), nor headers or bodies. It is bounded
// by LearnLimits: a new host past Hosts, or a new (method, path) past
// PerHost or Requests, is counted as dropped, with its method for the
// host, and never held; a request already held is always counted. Memory
// is at most about Requests × (path bytes ≤ 515 + 100).
type LearnRecord struct {
	lim LearnLimits

	mu       sync.Mutex
	since    time.Time
	hosts    map[string]*learnHost
	requests int // distinct (host, method, path) held
	// droppedHosts counts requests to hosts not held (Hosts reached).
	droppedHosts uint64
	refused      map[string]uint64 // by reason code, a closed set
	names        map[string]uint64
	droppedNames uint64
}

type learnHost struct {
	ports    []uint16
	tunnel   bool
	connects uint64
	reqs     map[learnKey]*LearnRequest
	dropped  uint64
	// droppedMethods are the methods of dropped requests, bounded as the
	// method is.
	droppedMethods map[string]bool
}

type learnKey struct{ method, path string }

// NewLearnRecord returns an empty record bounded by lim.
func NewLearnRecord(lim LearnLimits) *LearnRecord {
	r := &LearnRecord{lim: lim.withDefaults()}
	r.reset(time.Time{})
	return r
}

func (r *LearnRecord) reset(now time.Time) {
	r.since = now
	r.hosts = map[string]*learnHost{}
	r.requests = 0
	r.droppedHosts = 0
	r.refused = map[string]uint64{}
	r.names = map[string]uint64{}
	r.droppedNames = 0
}

// start notes when learning began, unless the record holds something
// already: a learn session stopped and started again adds up.
func (r *LearnRecord) start(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.since.IsZero() || len(r.hosts) == 0 && len(r.names) == 0 && len(r.refused) == 0 {
		r.since = now
	}
}

// Clear forgets everything; the record starts again at now.
func (r *LearnRecord) Clear(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reset(now)
}

// IsWrite reports whether a request with method can carry data out: any
// method but GET, HEAD and OPTIONS (their bodies are not forbidden, but no
// server is expected to read them).
func IsWrite(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS":
		return false
	}
	return true
}

func cutMethod(m string) string {
	if len(m) > maxMethodBytes {
		return strings.ToValidUTF8(m[:maxMethodBytes], "") + "…"
	}
	return m
}

func (r *LearnRecord) name(n string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.names[n]; ok || len(r.names) < r.lim.Names {
		r.names[n]++
		return
	}
	r.droppedNames++
}

func (r *LearnRecord) observe(o Observation, now time.Time) {
	if o.Host == HealthcheckName || o.Host == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !o.Allowed {
		// Reason codes are the filters' own, a closed set: the map
		// cannot grow with what the guest sends.
		r.refused[o.Reason]++
		return
	}
	h := r.hosts[o.Host]
	if h == nil {
		if len(r.hosts) >= r.lim.Hosts {
			r.droppedHosts++
			return
		}
		h = &learnHost{reqs: map[learnKey]*LearnRequest{}}
		r.hosts[o.Host] = h
	}
	if o.Port != 0 && len(h.ports) < maxPorts && !containsPort(h.ports, o.Port) {
		h.ports = append(h.ports, o.Port)
	}
	if o.Kind == "connect" {
		h.connects++
		h.tunnel = h.tunnel || o.Tunnel
		return
	}
	k := learnKey{cutMethod(o.Method), o.Path}
	if q := h.reqs[k]; q != nil {
		q.Count++
		q.Status = o.Status
		q.LastSeen = now
		return
	}
	if len(h.reqs) >= r.lim.PerHost || r.requests >= r.lim.Requests {
		h.dropped++
		if h.droppedMethods == nil {
			h.droppedMethods = map[string]bool{}
		}
		if len(h.droppedMethods) < maxPorts {
			h.droppedMethods[k.method] = true
		}
		return
	}
	h.reqs[k] = &LearnRequest{Method: k.method, Path: k.path, Status: o.Status, Count: 1, Write: IsWrite(k.method), FirstSeen: now, LastSeen: now}
	r.requests++
}

func containsPort(ps []uint16, p uint16) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// LearnRequest is one distinct (method, path) of a host.
type LearnRequest struct {
	Method string `json:"method"`
	// Path is the escaped path as the guest sent it, without the query.
	Path string `json:"path"`
	// Status is the last response's status.
	Status int    `json:"status"`
	Count  uint64 `json:"count"`
	// Write: the method can carry data out (not GET, HEAD or OPTIONS).
	Write     bool      `json:"write"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// LearnHost is what was seen of one host name.
type LearnHost struct {
	Host  string   `json:"host"`
	Ports []uint16 `json:"ports,omitempty"`
	// Tunnel: reached through a tunnel the proxy does not read, so its
	// requests are not in Requests.
	Tunnel bool `json:"tunnel,omitempty"`
	// Connects counts CONNECTs (intercepted or tunnelled).
	Connects uint64         `json:"connects,omitempty"`
	Requests []LearnRequest `json:"requests"`
	// Dropped counts requests on (method, path) pairs not held because a
	// bound was reached; DroppedMethods are their methods.
	Dropped        uint64   `json:"dropped,omitempty"`
	DroppedMethods []string `json:"dropped_methods,omitempty"`
}

// LearnSnapshot is a copy of the record, hosts sorted by name and
// requests by path then method.
type LearnSnapshot struct {
	Since time.Time   `json:"since,omitzero"`
	Hosts []LearnHost `json:"hosts"`
	// Names were decided (resolved, or asked of the proxy) in learn mode,
	// with how often.
	Names map[string]uint64 `json:"names,omitempty"`
	// Refused counts what learn mode refused, by reason code.
	Refused      map[string]uint64 `json:"refused,omitempty"`
	DroppedHosts uint64            `json:"dropped_hosts,omitempty"`
	DroppedNames uint64            `json:"dropped_names,omitempty"`
	Limits       LearnLimits       `json:"limits"`
}

// Snapshot copies the record.
func (r *LearnRecord) Snapshot() LearnSnapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := LearnSnapshot{Since: r.since, Hosts: make([]LearnHost, 0, len(r.hosts)), DroppedHosts: r.droppedHosts, DroppedNames: r.droppedNames, Limits: r.lim}
	for name, h := range r.hosts {
		lh := LearnHost{Host: name, Ports: append([]uint16(nil), h.ports...), Tunnel: h.tunnel, Connects: h.connects, Dropped: h.dropped, Requests: make([]LearnRequest, 0, len(h.reqs))}
		sort.Slice(lh.Ports, func(i, j int) bool { return lh.Ports[i] < lh.Ports[j] })
		for _, q := range h.reqs {
			lh.Requests = append(lh.Requests, *q)
		}
		sort.Slice(lh.Requests, func(i, j int) bool {
			a, b := lh.Requests[i], lh.Requests[j]
			if a.Path != b.Path {
				return a.Path < b.Path
			}
			return a.Method < b.Method
		})
		for m := range h.droppedMethods {
			lh.DroppedMethods = append(lh.DroppedMethods, m)
		}
		sort.Strings(lh.DroppedMethods)
		s.Hosts = append(s.Hosts, lh)
	}
	sort.Slice(s.Hosts, func(i, j int) bool { return s.Hosts[i].Host < s.Hosts[j].Host })
	if len(r.names) > 0 {
		s.Names = make(map[string]uint64, len(r.names))
		for n, c := range r.names {
			s.Names[n] = c
		}
	}
	if len(r.refused) > 0 {
		s.Refused = make(map[string]uint64, len(r.refused))
		for k, c := range r.refused {
			s.Refused[k] = c
		}
	}
	return s
}
