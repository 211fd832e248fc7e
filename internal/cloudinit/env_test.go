package cloudinit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestProxyEnvironmentSurvivesTheShell: every variable, sourced from the
// profile file the seed writes, has exactly the value of the table (the
// JVM options hold blanks and must not be split or run).
func TestProxyEnvironmentSurvivesTheShell(t *testing.T) {
	c := testConfig(t)
	b, err := UserData(c)
	if err != nil {
		t.Fatal(err)
	}
	var ud struct {
		WriteFiles []fileSpec `yaml:"write_files"`
	}
	if err := yaml.Unmarshal(b, &ud); err != nil {
		t.Fatal(err)
	}
	var profile string
	for _, f := range ud.WriteFiles {
		if f.Path == "/etc/profile.d/abox-proxy.sh" {
			profile = f.Content
		}
	}
	p := filepath.Join(t.TempDir(), "abox-proxy.sh")
	os.WriteFile(p, []byte(profile), 0o644)
	env := ProxyEnvironment(c)
	var script strings.Builder
	script.WriteString(". " + p + "\n")
	for _, kv := range env {
		script.WriteString(`printf '%s\n' "$` + kv[0] + `"` + "\n")
	}
	out, err := exec.Command("sh", "-c", script.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("sourcing the profile: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(env) {
		t.Fatalf("%d values for %d variables:\n%s", len(lines), len(env), out)
	}
	for i, kv := range env {
		if lines[i] != kv[1] {
			t.Errorf("%s = %q after sourcing, want %q", kv[0], lines[i], kv[1])
		}
	}
	want := "-Dhttp.proxyHost=" + c.Gateway.String() + " -Dhttp.proxyPort="
	if !strings.Contains(profile, want) {
		t.Errorf("no JVM proxy properties in the profile:\n%s", profile)
	}
}
