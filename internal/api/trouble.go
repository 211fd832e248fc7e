package api

import (
	"encoding/json"
	"fmt"
	"sort"
)

// Trouble lists what the filters report wrong while they keep enforcing:
// an allowlist change in force but not written to disk, a decision log
// that cannot be written, panics contained (each ended one connection or
// query, a bug some input reaches). `abox status` and `abox doctor` both
// show it.
func (s Status) Trouble() []string {
	var out []string
	if s.Allowlist.Unsaved != "" {
		out = append(out, "allowlist change in force but not saved: "+s.Allowlist.Unsaved)
	}
	names := make([]string, 0, len(s.Components))
	for n := range s.Components {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if msg := LogTrouble(s.Components[n]); msg != "" {
			out = append(out, n+" decision log cannot be written: "+msg)
		}
		if p := panics(s.Components[n]); p > 0 {
			out = append(out, fmt.Sprintf("%s filter contained %d panics (each ended one connection or query; \"panic contained\" lines with their stacks are in the daemon's log)", n, p))
		}
	}
	return out
}

// panics is the "panics" counter of a filter's stats, 0 without one.
func panics(stats any) uint64 {
	var m struct {
		Panics uint64 `json:"panics"`
	}
	b, err := json.Marshal(stats)
	if err != nil || json.Unmarshal(b, &m) != nil {
		return 0
	}
	return m.Panics
}

// LogTrouble is the decision log's last write error in a filter's
// counters (a component's Stats, as the struct or its JSON object):
// log_error (DNS) or log.last_error (HTTP); "" when there is none.
func LogTrouble(stats any) string {
	var m map[string]any
	b, err := json.Marshal(stats)
	if err != nil || json.Unmarshal(b, &m) != nil {
		return ""
	}
	if s, _ := m["log_error"].(string); s != "" {
		return s
	}
	if l, ok := m["log"].(map[string]any); ok {
		s, _ := l["last_error"].(string)
		return s
	}
	return ""
}
