// Package metrics holds the Prometheus metrics of one instance's data plane:
// a registry labelled with the instance, and counters built so that the
// filters count each decision once, where its line is finished, without a
// map lookup or an allocation per request on the common path.
package metrics

import (
	"net/http"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Layers, the value of the "layer" label.
const (
	LayerDNS     = "dns"
	LayerHTTP    = "http"
	LayerDaemon  = "daemon"
	LayerMonitor = "monitor"
)

// OtherReason is the reason label of a decision whose reason is not a
// reason code (not lower-case letters, digits and '_', or longer than
// maxReasonLen) or comes after MaxReasons distinct ones: the label set
// stays bounded whatever a caller passes.
const OtherReason = "other"

// MaxReasons bounds the (verdict, reason code) children of one Decisions,
// besides those of OtherReason.
const MaxReasons = 64

const maxReasonLen = 48

// Registry is the metrics of one instance's data plane. The zero value is
// not usable; a nil *Registry is "metrics off" for every constructor here.
type Registry struct {
	reg      *prometheus.Registry
	instance string
}

// New returns an empty registry whose every metric carries instance as its
// "instance" label.
func New(instance string) *Registry {
	return &Registry{reg: prometheus.NewRegistry(), instance: instance}
}

// Instance is the instance label's value.
func (r *Registry) Instance() string { return r.instance }

// Gatherer is what a scrape reads.
func (r *Registry) Gatherer() prometheus.Gatherer { return r.reg }

// Handler serves the text exposition (or what the scraper negotiates).
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// layer returns a registerer that adds the instance and layer labels.
func (r *Registry) layer(layer string) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{"instance": r.instance, "layer": layer}, r.reg)
}

// Counter registers a counter of layer without variable labels.
func (r *Registry) Counter(layer, name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	r.layer(layer).MustRegister(c)
	return c
}

// CounterFunc registers a counter of layer whose value f reads when scraped
// (a count kept elsewhere, such as the filter restarts the supervisor
// passes in).
func (r *Registry) CounterFunc(layer, name, help string, f func() float64) {
	r.layer(layer).MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
}

// Collector registers c, a collector that reads its values when scraped,
// under layer.
func (r *Registry) Collector(layer string, c prometheus.Collector) {
	r.layer(layer).MustRegister(c)
}

// Histogram registers a histogram of layer in seconds with buckets.
func (r *Registry) Histogram(layer, name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	r.layer(layer).MustRegister(h)
	return h
}

// CounterVec registers a counter of layer with one variable label whose
// values are the closed set values: their children are built now, so that
// a caller holds them and never looks a label up per event.
func (r *Registry) CounterVec(layer, name, help, label string, values ...string) []prometheus.Counter {
	f := r.Family(layer, name, help, label)
	out := make([]prometheus.Counter, len(values))
	for i, val := range values {
		out[i] = f.Child(val)
	}
	return out
}

// Family is a counter with variable labels of closed sets; a caller builds
// each child once, with Child, and holds it.
type Family struct{ vec *prometheus.CounterVec }

// Family registers a counter of layer with the variable labels.
func (r *Registry) Family(layer, name, help string, labels ...string) *Family {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	r.layer(layer).MustRegister(v)
	return &Family{vec: v}
}

// Child is the counter of the label values, one per label.
func (f *Family) Child(values ...string) prometheus.Counter { return f.vec.WithLabelValues(values...) }

// Decisions counts one kind of decision of a layer by verdict and reason
// (abox_dns_queries_total, abox_http_requests_total). Its children are
// built once per (verdict, reason) and then read from a copy-on-write
// table, so counting is an atomic load, a map read and an atomic add.
type Decisions struct {
	vec    *prometheus.CounterVec
	consts []string // the values of the labels before verdict and reason
	mu     sync.Mutex
	// table is immutable once published; mu serialises its replacement.
	table atomic.Pointer[decisionTable]
	// hot caches children by the address of their strings' bytes: the
	// reason codes are constants, so the same code is the same pointer
	// and a hit costs no hashing. A miss falls back to table.
	hot [hotSlots]atomic.Pointer[hotSlot]
}

const hotSlots = 32

// hotSlot is immutable once stored.
type hotSlot struct {
	verdict, reason *byte
	vlen, rlen      int
	c               prometheus.Counter
}

type decisionTable struct {
	// by[verdict] maps a reason to its child; verdicts beyond the two
	// known ones go to other.
	allow, block, other map[string]prometheus.Counter
	reasons             int
}

// Decisions registers name for layer with the variable labels extra (each
// Decisions made from it by For fixes them), then verdict and reason.
func (r *Registry) Decisions(layer, name, help string, extra ...string) *DecisionVec {
	labels := append(append([]string(nil), extra...), "verdict", "reason")
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	r.layer(layer).MustRegister(v)
	return &DecisionVec{vec: v, extra: len(extra)}
}

// DecisionVec is a family of decision counters; For fixes its extra labels.
type DecisionVec struct {
	vec   *prometheus.CounterVec
	extra int
}

// For returns the Decisions of the extra label values (as many as the
// family was registered with).
func (v *DecisionVec) For(values ...string) *Decisions {
	if len(values) != v.extra {
		panic("metrics: DecisionVec.For: wrong number of label values")
	}
	d := &Decisions{vec: v.vec, consts: append([]string(nil), values...)}
	d.table.Store(&decisionTable{allow: map[string]prometheus.Counter{}, block: map[string]prometheus.Counter{}, other: map[string]prometheus.Counter{}})
	return d
}

// Inc counts one decision. Safe for concurrent use; a nil d counts nothing.
func (d *Decisions) Inc(verdict, reason string) {
	if d == nil {
		return
	}
	vp, rp := unsafe.StringData(verdict), unsafe.StringData(reason)
	i := (uintptr(unsafe.Pointer(rp))>>3 ^ uintptr(len(reason)) ^ uintptr(unsafe.Pointer(vp))>>4) % hotSlots
	j := (i + 1) % hotSlots
	for _, k := range [2]uintptr{i, j} {
		if h := d.hot[k].Load(); h != nil && h.reason == rp && h.verdict == vp && h.rlen == len(reason) && h.vlen == len(verdict) {
			h.c.Inc()
			return
		}
	}
	t := d.table.Load()
	c, ok := t.byVerdict(verdict)[reason]
	if !ok {
		c = d.child(verdict, reason)
	}
	c.Inc()
	// A slot is taken once and kept: two strings that share slots never
	// evict each other (the second is counted through the table, without
	// allocating), and the slots hold at most hotSlots strings alive.
	if rp != nil && vp != nil && isReasonCode(reason) && (d.hot[i].Load() == nil || d.hot[j].Load() == nil) {
		h := &hotSlot{verdict: vp, reason: rp, vlen: len(verdict), rlen: len(reason), c: c}
		if !d.hot[i].CompareAndSwap(nil, h) {
			d.hot[j].CompareAndSwap(nil, h)
		}
	}
}

func (t *decisionTable) byVerdict(verdict string) map[string]prometheus.Counter {
	switch verdict {
	case "allow":
		return t.allow
	case "block":
		return t.block
	}
	return t.other
}

// child builds (once) the counter of verdict and reason, folding a reason
// that is no reason code, or one too many, into OtherReason.
func (d *Decisions) child(verdict, reason string) prometheus.Counter {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.table.Load()
	if c, ok := t.byVerdict(verdict)[reason]; ok {
		return c
	}
	label := reason
	if !isReasonCode(reason) || t.reasons >= MaxReasons {
		label = OtherReason
	}
	vlabel := verdict
	if verdict != "allow" && verdict != "block" {
		vlabel = "other"
	}
	c := d.vec.WithLabelValues(append(append([]string(nil), d.consts...), vlabel, label)...)
	// Copy on write: readers keep the table they loaded.
	n := &decisionTable{allow: t.allow, block: t.block, other: t.other, reasons: t.reasons}
	m := make(map[string]prometheus.Counter, len(t.byVerdict(verdict))+1)
	for k, v := range t.byVerdict(verdict) {
		m[k] = v
	}
	// An unbounded stream of junk reasons maps to one child but must not
	// grow the table: only codes and the first junk reason are kept.
	if label == reason || len(m) < MaxReasons*2 {
		m[reason] = c
	}
	switch vlabel {
	case "allow":
		n.allow = m
	case "block":
		n.block = m
	default:
		n.other = m
	}
	if label == reason {
		n.reasons++
	}
	d.table.Store(n)
	return c
}

// isReasonCode: lower-case letters, digits and '_', at most maxReasonLen
// bytes, not empty; a host name or path never passes (no '.', no '/').
func isReasonCode(s string) bool {
	if s == "" || len(s) > maxReasonLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// LatencyBuckets are the buckets of a lookup latency in seconds: 0.5 ms to
// 5 s.
var LatencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
