package cloudinit

import (
	"os/exec"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestTetragonPolicies: the default policy hooks what docs/monitor.md
// says (sensitive files below the login user's home, connects) and parses
// as YAML of Tetragon's TracingPolicy shape.
func TestTetragonPolicies(t *testing.T) {
	pol := TetragonPolicies("dev")
	type kprobe struct {
		Call string `yaml:"call"`
		Args []struct {
			Index int    `yaml:"index"`
			Type  string `yaml:"type"`
		} `yaml:"args"`
		Selectors []struct {
			MatchArgs []struct {
				Operator string   `yaml:"operator"`
				Values   []string `yaml:"values"`
			} `yaml:"matchArgs"`
		} `yaml:"selectors"`
	}
	var doc struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Spec struct {
			Kprobes []kprobe `yaml:"kprobes"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(pol["abox-sensitive-files.yaml"]), &doc); err != nil {
		t.Fatal(err)
	}
	k := doc.Spec.Kprobes
	if doc.Kind != "TracingPolicy" || len(k) != 1 || k[0].Call != "security_file_permission" || len(k[0].Args) != 2 || k[0].Args[0].Type != "file" || k[0].Args[1].Type != "int" {
		t.Fatalf("sensitive files policy: %+v", doc)
	}
	var prefixes []string
	for _, s := range k[0].Selectors {
		for _, m := range s.MatchArgs {
			if m.Operator == "Prefix" {
				prefixes = append(prefixes, m.Values...)
			}
		}
	}
	for _, want := range []string{"/etc/shadow", "/etc/sudoers", "/root/", "/home/dev/.ssh/", "/home/dev/.aws/"} {
		if !strings.Contains(strings.Join(prefixes, " "), want) {
			t.Errorf("no prefix %s in %v", want, prefixes)
		}
	}
	doc.Spec.Kprobes = nil
	if err := yaml.Unmarshal([]byte(pol["abox-connects.yaml"]), &doc); err != nil {
		t.Fatal(err)
	}
	if k := doc.Spec.Kprobes; len(k) != 1 || k[0].Call != "tcp_connect" || k[0].Args[0].Type != "sock" {
		t.Fatalf("connects policy: %+v", doc)
	}
}

// TestTetragonInstallScript: the script the guest runs is valid sh, checks
// the digest before it unpacks, and keeps a hostile top directory quoted.
func TestTetragonInstallScript(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	s := tetragonInstallScript(sha, "tetragon-v1.7.1-amd64", "abox")
	if out, err := exec.Command("sh", "-n", "-c", s).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v\n%s\n%s", err, out, s)
	}
	if lock, first := strings.Index(s, "flock 9"), strings.Index(s, "cat >"); lock < 0 || lock > first {
		t.Errorf("the setup does not take the guest's lock before it reads the bundle:\n%s", s)
	}
	check, unpack := strings.Index(s, `[ "$got" != "$want" ]`), strings.Index(s, "tar -xzf")
	if check < 0 || unpack < 0 || check > unpack || !strings.Contains(s, "want="+sha) {
		t.Errorf("the digest is not checked before tar runs:\n%s", s)
	}
	for _, want := range []string{"--export-filename " + MonitorExport, "--tracing-policy-dir " + TetragonPolicyDir, "systemctl enable " + TetragonUnit + " " + MonitorUnit} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q", want)
		}
	}
	if s := tetragonInstallScript(sha, "$(reboot)", "abox"); !strings.Contains(s, `s="$d/x"/'$(reboot)'`) {
		t.Errorf("the top directory is not quoted:\n%s", s)
	}
	if c := TetragonAgentCommand(sha, "", "abox"); !strings.HasPrefix(c, "sudo -n sh -c '") || !strings.Contains(c, `s="$d/x"/'\''.'\''`) {
		t.Errorf("command: %.200s", c)
	}
}
