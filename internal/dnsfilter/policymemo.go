package dnsfilter

import (
	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/policy"
)

// policyMemo is one UDP reader's memo of the names it decided in active
// mode, each with the list it was decided under. In active mode the
// decision is a pure function of the list and the name (policy.Evaluate),
// and a list is never changed once in force (an edit or a reload puts a
// new one in force), so a name asked again under the same list gets the
// same decision without evaluating it again; under another list, or in
// passive mode (which records the names it allows), it is decided afresh.
// The memo is bounded: at maxDecided names it is forgotten at once.
type policyMemo struct {
	m map[string]decided
}

type decided struct {
	list *allowlist.List
	d    allowlist.Decision
}

// maxDecided bounds the names a policyMemo holds.
const maxDecided = 512

// decideName is the policy's decision for n (normalised), through pm when
// it is not nil.
func (s *Server) decideName(n string, pm *policyMemo) allowlist.Decision {
	if pm == nil || s.pol.Mode() != policy.Active {
		return s.pol.DecideNormalized(n)
	}
	l := s.pol.List()
	if m, ok := pm.m[n]; ok && m.list == l {
		return m.d
	}
	d := policy.Evaluate(l, policy.Active, n)
	if pm.m == nil || len(pm.m) >= maxDecided {
		pm.m = make(map[string]decided)
	}
	pm.m[n] = decided{list: l, d: d}
	return d
}
