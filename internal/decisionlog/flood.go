package decisionlog

import (
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"
)

// Defaults of the refusal aggregation (Config.RefusalsPerClient, FloodInterval).
const (
	DefaultRefusalsPerClient = 20
	DefaultFloodInterval     = time.Second
	// maxFloodClients bounds the per-client table; beyond it, new clients
	// share one entry ("*") so a spray of sources cannot grow it.
	maxFloodClients = 1024
)

// overflowClient is the key the clients past maxFloodClients share: the
// zero Addr's neighbour no client has (IPv6 unspecified with a zone).
var overflowClient = netip.IPv6Unspecified().WithZone("overflow")

// flood counts refusal lines per client and interval. Past the budget, a
// client's refusals are not written one by one but counted, and one WARN
// line "refusals aggregated" per client and interval carries the counts: a
// guest that loops on a blocked name costs the disk a line a second, not
// 34 MB, and the operator still sees what it tried and how often.
type flood struct {
	budget   int
	interval time.Duration
	msg      string // of the aggregate lines

	mu      sync.Mutex
	clients map[netip.Addr]*floodWindow
}

type floodWindow struct {
	start      time.Time
	lines      int
	suppressed map[string]uint64 // by reason
	total      uint64
}

func newFlood(budget int, interval time.Duration, msg string) *flood {
	return &flood{budget: budget, interval: interval, msg: msg, clients: map[netip.Addr]*floodWindow{}}
}

// admit reports whether a refusal line of client may be written now, and
// counts it as suppressed otherwise.
func (f *flood) admit(client netip.Addr, reason string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.clients[client]
	if w == nil {
		if len(f.clients) >= maxFloodClients {
			client = overflowClient
			w = f.clients[client]
		}
		if w == nil {
			w = &floodWindow{start: now}
			f.clients[client] = w
		}
	}
	if now.Sub(w.start) >= f.interval && w.total == 0 {
		w.start, w.lines = now, 0
	}
	if w.lines < f.budget {
		w.lines++
		return true
	}
	if w.suppressed == nil {
		w.suppressed = map[string]uint64{}
	}
	w.suppressed[reason]++
	w.total++
	return false
}

// summaries returns the aggregate lines of the windows that have ended,
// and forgets clients that were quiet for a whole interval.
func (f *flood) summaries(now time.Time) [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]byte
	for client, w := range f.clients {
		if now.Sub(w.start) < f.interval {
			continue
		}
		if w.total == 0 {
			delete(f.clients, client)
			continue
		}
		reasons := make([]string, 0, len(w.suppressed))
		for r, n := range w.suppressed {
			reasons = append(reasons, r+"="+itoa(n))
		}
		sort.Strings(reasons)
		l := NewLine(now, slog.LevelWarn, f.msg)
		name := client.String()
		if client == overflowClient {
			name = "*"
		}
		l.String("client", name).
			Int("suppressed", int64(w.total)).
			String("reasons", strings.Join(reasons, ",")).
			Int("logged", int64(w.lines)).
			Float("interval_ms", float64(now.Sub(w.start).Microseconds())/1000)
		out = append(out, append([]byte(nil), l.finish()...))
		l.Free()
		// The next window starts now and begins with a fresh budget.
		*w = floodWindow{start: now}
	}
	return out
}

func itoa(n uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return string(b[i:])
}
