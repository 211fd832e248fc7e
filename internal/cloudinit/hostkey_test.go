package cloudinit

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestHostKeyPinned: the host key abox generated reaches cloud-init's
// ssh_keys, so the key pinned in known_hosts is the one sshd presents.
func TestHostKeyPinned(t *testing.T) {
	c := testConfig(t)
	c.HostPublicKey = fixedKey(t)
	c.HostKeyPEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
	b, err := UserData(c)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		SSHKeys       map[string]string `yaml:"ssh_keys"`
		SSHDeleteKeys bool              `yaml:"ssh_deletekeys"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SSHKeys["ed25519_public"] != c.HostPublicKey || !strings.Contains(doc.SSHKeys["ed25519_private"], "BEGIN OPENSSH PRIVATE KEY") {
		t.Errorf("ssh_keys = %v", doc.SSHKeys)
	}
	if !doc.SSHDeleteKeys {
		t.Error("image host keys are kept: every instance of a base would share them")
	}
	c.HostKeyPEM = ""
	if _, err := UserData(c); err == nil {
		t.Error("a public host key without its private half was accepted")
	}
}

// TestSSHDConfiguredBeforeFirstStart: password logins are turned off by a
// file sshd reads when it first starts, not by ssh_pwauth, which makes
// cloud-init restart sshd later and refuse connections just after the guest
// first answered.
func TestSSHDConfiguredBeforeFirstStart(t *testing.T) {
	b, err := UserData(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc["ssh_pwauth"]; ok {
		t.Error("user-data sets ssh_pwauth: cloud-init would restart sshd after boot")
	}
	if !strings.Contains(string(b), "/etc/ssh/sshd_config.d/10-abox.conf") || !strings.Contains(string(b), "PasswordAuthentication no") {
		t.Errorf("no sshd drop-in turning passwords off:\n%s", b)
	}
}
