package policy

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/abox-dev/abox/internal/allowlist"
)

// Change is a change of the policy in force, for Config.OnChange: the
// allowlist (Kind "allowlist", Old and New the SHA-256 of its text) or the
// mode (Kind "mode", Old and New the modes).
type Change struct {
	Kind string `json:"kind"`
	// Trigger is what made it: "add", "remove", "edit" (API edits),
	// "reload" (API or SIGHUP), "file change" (the file watch), "mode".
	Trigger string `json:"trigger"`
	Old     string `json:"old"`
	New     string `json:"new"`
	Entries int    `json:"entries,omitempty"`
}

// ListHash is the hex SHA-256 of the list's text, as Change carries it.
func ListHash(l *allowlist.List) string {
	h := sha256.Sum256([]byte(l.Text()))
	return hex.EncodeToString(h[:])
}

// changed reports a list change to Config.OnChange, if there is one.
func (e *Engine) changed(trigger string, old, now *allowlist.List) {
	if e.onChange == nil {
		return
	}
	e.onChange(Change{Kind: "allowlist", Trigger: trigger, Old: ListHash(old), New: ListHash(now), Entries: now.Len()})
}
