package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/paths"
)

func TestInitWritesALoadableStarterOnce(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	file := filepath.Join(t.TempDir(), "abox.yaml")
	if out, err := runCLI(l, "init", "-f", file, "--name", "proj", "--preset", "npm", "--preset", "github"); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	p, err := config.Load(file)
	if err != nil {
		t.Fatalf("the starter does not load: %v", err)
	}
	defer p.Close()
	if p.Name != "proj" || len(p.Allowlist) == 0 {
		t.Errorf("starter: name %q, %d entries", p.Name, len(p.Allowlist))
	}
	// The presets widen the allowlist; init trusts what it wrote, and
	// only that content.
	ts := config.TrustStore{Dir: filepath.Join(l.Root, "trust")}
	if err := ts.Check(p); err != nil {
		t.Errorf("the file init wrote is not trusted: %v", err)
	}
	b, _ := os.ReadFile(file)
	defer os.WriteFile(file, b, 0o644)
	// A comment only restates what was trusted (it passes, see
	// config.TestTrustByRule); a name more widens it.
	os.WriteFile(file, bytes.Replace(b, []byte("  - registry.npmjs.org\n"), []byte("  - registry.npmjs.org\n  - exfil.example.net\n"), 1), 0o644)
	if ep, err := config.Load(file); err != nil {
		t.Fatal(err)
	} else if err := ts.Check(ep); !errors.Is(err, config.ErrUntrusted) {
		ep.Close()
		t.Errorf("other content inherited init's trust: %v", err)
	} else {
		ep.Close()
	}
	before, _ := os.ReadFile(file)
	if out, err := runCLI(l, "init", "-f", file); err == nil || !strings.Contains(out+err.Error(), "exists") {
		t.Errorf("init over an existing file: %v\n%s", err, out)
	}
	if after, _ := os.ReadFile(file); string(after) != string(before) {
		t.Error("the refused init changed the file")
	}
	var ue usageError
	if _, err := runCLI(l, "init", "-f", filepath.Join(t.TempDir(), "x.yaml"), "--preset", "nope"); !errors.As(err, &ue) {
		t.Errorf("unknown preset: %v, want a usage error", err)
	}
	if _, err := runCLI(l, "init", "-f", filepath.Join(t.TempDir(), "x.yaml"), "--name", "bad name"); !errors.As(err, &ue) {
		t.Errorf("bad name: %v, want a usage error", err)
	}
}

// TestInitTrustsWhatItWrote: a file that is not what init wrote by the
// time it is read back (another program replaced it in between) is not
// trusted, and the error says what to do.
func TestInitTrustsWhatItWrote(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	e := &env{layout: func() (paths.Layout, error) { return l, nil }}
	file := filepath.Join(t.TempDir(), "abox.yaml")
	text, err := config.Starter("proj", []string{"npm"})
	if err != nil {
		t.Fatal(err)
	}
	swapped := strings.Replace(text, "\nallowlist:\n", "\nallowlist:\n  - exfil.example.net\n", 1)
	if swapped == text {
		t.Fatal("the starter has no allowlist block to add to")
	}
	if err := os.WriteFile(file, []byte(swapped), 0o644); err != nil {
		t.Fatal(err)
	}
	err = e.trustWritten(file, []byte(text))
	if err == nil || !strings.Contains(err.Error(), "changed between abox init writing it and trusting it") || !strings.Contains(err.Error(), "abox trust -f "+file) {
		t.Fatalf("trusting a file that is not what init wrote = %v", err)
	}
	p, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := (config.TrustStore{Dir: filepath.Join(l.Root, "trust")}).Check(p); !errors.Is(err, config.ErrUntrusted) {
		t.Errorf("the swapped file is trusted: %v", err)
	}
	// What init wrote is trusted.
	os.WriteFile(file, []byte(text), 0o644)
	if err := e.trustWritten(file, []byte(text)); err != nil {
		t.Fatal(err)
	}
}

// TestTrustRecordsOutsideTheProject: trust writes under the data root only
// and only for a file that widens something.
func TestTrustRecordsOutsideTheProject(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	dir := t.TempDir()
	file := filepath.Join(dir, "abox.yaml")
	os.WriteFile(file, []byte("version: 1\nname: dev\nports: [443]\n"), 0o644)
	if out, err := runCLI(l, "trust", "-f", file); err != nil || !strings.Contains(out, "widens nothing") {
		t.Errorf("trust of a tightening file: %v\n%s", err, out)
	}
	os.WriteFile(file, []byte("version: 1\nname: dev\nports: [443, 8443]\n"), 0o644)
	out, err := runCLI(l, "trust", "-f", file)
	if err != nil || !strings.Contains(out, "ports: lets the proxy connect to ports 8443") {
		t.Fatalf("trust: %v\n%s", err, out)
	}
	recs, _ := filepath.Glob(filepath.Join(l.Root, "trust", "*.json"))
	if len(recs) != 1 {
		t.Errorf("%d trust records under the data root, want 1", len(recs))
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("trust wrote into the project: %d entries", len(entries))
	}
	os.WriteFile(file, []byte("version: 1\nname: dev\nportz: [443]\n"), 0o644)
	if _, err := runCLI(l, "trust", "-f", file); err == nil || !strings.Contains(err.Error(), `abox.yaml:3:1: unknown key "portz" (did you mean "ports"?)`) {
		t.Errorf("trust of a broken file: %v", err)
	}
}
