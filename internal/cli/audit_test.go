package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/audit"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// auditRig is a data root with instance dev, its allowlist and an audit
// stream of n decision lines, and a way to run CLI commands on it.
func auditRig(t *testing.T, n int) (run func(args ...string) (string, string, error), l paths.Layout) {
	t.Helper()
	l = paths.Layout{Root: t.TempDir()}
	os.MkdirAll(l.InstanceDir("dev"), 0o700)
	os.WriteFile(l.Allowlist("dev"), []byte("example.com\n"), 0o600)
	key, err := audit.LoadKey(instance.AuditKey(l))
	if err != nil {
		t.Fatal(err)
	}
	s, err := audit.Open(audit.Config{Dir: instance.AuditDir(l.Instance("dev")), Key: key})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		s.Write([]byte(`{"msg":"dns","name":"n` + string(rune('a'+i)) + `.example","verdict":"allow"}` + "\n"))
	}
	s.Close()
	run = func(args ...string) (string, string, error) { return runCLIIn(l, "", args...) }
	return run, l
}

func TestAuditVerifyCommand(t *testing.T) {
	run, l := auditRig(t, 5)
	out, _, err := run("audit", "verify", "dev")
	if err != nil || !strings.Contains(out, "verifies: 6 lines") {
		t.Fatalf("verify of an intact stream: %v\n%s", err, out)
	}
	path := filepath.Join(instance.AuditDir(l.Instance("dev")), audit.FileName)
	b, _ := os.ReadFile(path)
	os.WriteFile(path, bytes.Replace(b, []byte("nc.example"), []byte("ok.example"), 1), 0o600)
	out, _, err = run("audit", "verify", "dev")
	if err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("verify of an edited stream: %v", err)
	}
	if want := path + ":4: does not chain"; !strings.Contains(out, want) {
		t.Errorf("verify output %q does not name %s", out, want)
	}
	if _, _, err := run("audit", "verify", "nosuch"); err == nil || !strings.Contains(err.Error(), "no audit stream") {
		t.Errorf("verify of an unknown instance: %v", err)
	}
}

func TestAuditExportCommand(t *testing.T) {
	run, _ := auditRig(t, 5)
	out := filepath.Join(t.TempDir(), "bundle")
	if _, stderr, err := run("audit", "export", "dev", "--out", out, "--with-key"); err != nil || !strings.Contains(stderr, "exported 1 file") {
		t.Fatalf("export: %v %s", err, stderr)
	}
	// Opened from elsewhere, with the bundle's own key.
	moved := filepath.Join(t.TempDir(), "moved")
	if err := os.Rename(out, moved); err != nil {
		t.Fatal(err)
	}
	if o, _, err := run("audit", "verify", "--bundle", moved); err != nil || !strings.Contains(o, "verifies") {
		t.Errorf("verify --bundle: %v %s", err, o)
	}
	pol, _ := os.ReadFile(filepath.Join(moved, audit.PolicyName))
	if string(pol) != "example.com\n" {
		t.Errorf("bundle policy %q, want the allowlist in force", pol)
	}
	// The export was recorded in the stream, which still verifies.
	if o, _, err := run("audit", "verify", "dev"); err != nil || !strings.Contains(o, "verifies: 8 lines") {
		t.Errorf("after the export: %v %s", err, o)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"audit", "export", "dev"}, "--out"},
		{[]string{"audit", "export", "dev", "--out", filepath.Join(t.TempDir(), "x"), "--since", "yesterday"}, "neither an RFC 3339"},
		{[]string{"audit", "export", "dev", "--out", moved}, "exists"},
	} {
		if _, _, err := run(tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	if got, _ := parseSince("24h", now); !got.Equal(now.Add(-24 * time.Hour)) {
		t.Errorf("24h: %v", got)
	}
	if got, _ := parseSince("2026-12-01T00:00:00Z", now); got.Day() != 1 {
		t.Errorf("RFC 3339: %v", got)
	}
	if _, err := parseSince("-1h", now); err == nil {
		t.Error("a negative duration was accepted")
	}
}
