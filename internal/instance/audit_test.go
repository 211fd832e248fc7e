package instance

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/audit"
)

// auditKinds are the kinds of the records in dev's audit stream, after
// checking that it verifies.
func auditKinds(t *testing.T, m *Manager) []string {
	t.Helper()
	dir := AuditDir(m.Layout.Instance("dev"))
	key, err := audit.ReadKey(AuditKey(m.Layout))
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := audit.Verify(dir, key, audit.Anchor{}); err != nil || !rep.OK() {
		t.Fatalf("audit stream: %v %v", err, rep.Problems)
	}
	b, err := os.ReadFile(filepath.Join(dir, audit.FileName))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r audit.Record
		json.Unmarshal([]byte(l), &r)
		kinds = append(kinds, r.Kind)
	}
	return kinds
}

// A revert that happened is in the audit stream; one refused is not.
func TestRevertIsAudited(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, false)
	if _, err := r.m.CreateSnapshot(ctx, "dev", "cold", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := r.m.RevertSnapshot(ctx, "dev", "nope"); err == nil {
		t.Fatal("revert to an unknown snapshot succeeded")
	}
	if _, err := r.m.RevertSnapshot(ctx, "dev", "cold"); err != nil {
		t.Fatal(err)
	}
	if got := auditKinds(t, r.m); strings.Join(got, ",") != AuditRevert+","+audit.KindCheckpoint {
		t.Errorf("audit records %v, want one revert and its checkpoint", got)
	}
}
