//go:build e2e

package e2e

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// noPanics matches a status holding "panics": 0.
var noPanics = regexp.MustCompile(`"panics":\s*0\b`)

// refusalStreamOnGuest: a real guest's blocked DNS query and blocked proxy
// request reach the instance's refusal streams (logs/dns.refusals.log,
// logs/http.refusals.log) and `abox dns|http logs NAME --refusals`, and its
// allowed query does not; the filters count no panic. The flood that
// cannot rotate a refusal away is daemon TestAllowedFloodKeepsRefusals
// (a TCG guest is too slow to send one in CI's time).
func refusalStreamOnGuest(t *testing.T, s *suite, name string, st instance.State) {
	gw := st.Gateway.String()
	const blocked = "dos-refusal-evidence.test"
	s.mustGuest(t, name, "dig +tries=2 +time=4 @"+gw+" "+blocked+" >/dev/null; dig +tries=2 +time=4 @"+gw+" allowed.test >/dev/null; "+
		"curl -s -o /dev/null --max-time 20 -x http://"+gw+":"+strconv.Itoa(int(st.ProxyPort))+" http://"+blocked+"/; true")
	files := paths.Layout{Root: s.home}.Instance(name)
	for _, c := range []struct{ component, file string }{{"dns", files.DNSLog}, {"http", files.HTTPLog}} {
		refusals := strings.TrimSuffix(c.file, ".log") + ".refusals.log"
		var text string
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			b, _ := os.ReadFile(refusals)
			if text = string(b); strings.Contains(text, blocked) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s holds no line for %s:\n%s", refusals, blocked, text)
			}
		}
		if strings.Contains(text, `"verdict":"allow"`) {
			t.Errorf("%s: an allowed line in the refusal stream:\n%s", refusals, text)
		}
		out := s.mustAbox(c.component, "logs", name, "--refusals")
		if !strings.Contains(out, blocked) || strings.Contains(out, `"verdict":"allow"`) {
			t.Errorf("abox %s logs %s --refusals:\n%s", c.component, name, out)
		}
		if st := s.mustAbox(c.component, "status", name, "--json"); !noPanics.MatchString(st) {
			t.Errorf("abox %s status: panics counted on a healthy instance:\n%s", c.component, st)
		}
	}
}
