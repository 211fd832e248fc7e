package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/abox-dev/abox/internal/audit"
)

// The audit stream holds the start, every decision of both filters
// (allowed and refused), and each policy change with its hashes; it
// verifies once the plane is down.
func TestAuditStreamOfAPlane(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(t.TempDir(), audit.KeyFile)
	p := startPlaneConfig(t, DNSConfig{RateLimit: -1}, HTTPConfig{}, LogConfig{}, func(c *Config) {
		c.AuditDir, c.AuditKey = filepath.Join(dir, "logs"), keyFile
	})
	const allowed, refused = 3, 2
	for range allowed {
		p.query(t, "allowed.test.")
	}
	for range refused {
		p.query(t, "refused.test.")
	}
	p.get(t, "refused.test")
	if _, err := p.api.AllowlistAdd(context.Background(), []string{"new.test"}); err != nil {
		t.Fatal(err)
	}
	p.stop()

	key, err := audit.LoadKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Verify(filepath.Join(dir, "logs"), key, audit.Anchor{})
	if err != nil || !rep.OK() {
		t.Fatalf("Verify: %v %v", err, rep.Problems)
	}
	if rep.Unsealed != 0 {
		t.Errorf("%d lines after the last checkpoint of a closed stream", rep.Unsealed)
	}
	counts := map[string]int{}
	verdicts := map[string]int{}
	f, err := os.Open(filepath.Join(dir, "logs", audit.FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r audit.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		counts[r.Kind]++
		if r.Kind == audit.KindDecision {
			var d struct{ Msg, Verdict string }
			json.Unmarshal(r.Data, &d)
			if d.Msg == "dns" || d.Msg == "request" {
				verdicts[d.Msg+"/"+d.Verdict]++
			}
		}
		if r.Kind == audit.KindPolicy {
			var c struct{ Kind, Trigger, Old, New string }
			json.Unmarshal(r.Data, &c)
			if c.Trigger != "add" || c.Old == "" || c.New == "" || c.Old == c.New {
				t.Errorf("policy record %s, want an add with two hashes", r.Data)
			}
		}
	}
	if counts[audit.KindFilters] != 1 || counts[audit.KindPolicy] != 1 {
		t.Errorf("records by kind %v, want one start and one policy change", counts)
	}
	if verdicts["dns/allow"] != allowed || verdicts["dns/block"] != refused || verdicts["request/block"] != 1 {
		t.Errorf("decisions %v, want %d allowed and %d refused queries and one refused request", verdicts, allowed, refused)
	}
}
