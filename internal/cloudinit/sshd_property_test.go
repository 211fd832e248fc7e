package cloudinit

import (
	"path"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// sshdOptions reads an sshd_config fragment as sshd does: keywords are
// case-insensitive, and the first value of a keyword wins.
func sshdOptions(t *testing.T, content string) map[string]string {
	t.Helper()
	opts := map[string]string{}
	for _, line := range strings.Split(content, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(strings.ReplaceAll(line, "=", " "))
		if len(f) < 2 {
			t.Fatalf("sshd line %q has no value", line)
		}
		k := strings.ToLower(f[0])
		if _, seen := opts[k]; !seen {
			opts[k] = strings.ToLower(f[1])
		}
	}
	return opts
}

// TestGuestLoginIsKeyOnly asserts the login properties of the rendered
// user-data itself, not its bytes: root login is off in cloud-init
// (disable_root) and in sshd, sshd takes neither passwords nor
// keyboard-interactive logins, the drop-in is read before the images' own
// drop-ins (sshd keeps the first value it sees), the user's password is
// locked, and cloud-init is not asked to turn password logins back on.
func TestGuestLoginIsKeyOnly(t *testing.T) {
	b, err := UserData(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if v, ok := doc["disable_root"].(bool); !ok || !v {
		t.Errorf("disable_root = %v, want true", doc["disable_root"])
	}
	if v, ok := doc["ssh_pwauth"]; ok && v != false {
		t.Errorf("ssh_pwauth = %v: cloud-init would turn password logins on", v)
	}
	users, _ := doc["users"].([]any)
	if len(users) == 0 {
		t.Fatal("no users")
	}
	for _, u := range users {
		m, ok := u.(map[string]any)
		if !ok {
			t.Errorf("user entry %v: the image's default user would be created", u)
			continue
		}
		if m["lock_passwd"] != true {
			t.Errorf("user %v: lock_passwd = %v, want true", m["name"], m["lock_passwd"])
		}
		if _, ok := m["passwd"]; ok {
			t.Errorf("user %v has a password", m["name"])
		}
		if _, ok := m["plain_text_passwd"]; ok {
			t.Errorf("user %v has a password", m["name"])
		}
	}
	files, _ := doc["write_files"].([]any)
	var dropins []string
	for _, f := range files {
		m, _ := f.(map[string]any)
		p, _ := m["path"].(string)
		content, _ := m["content"].(string)
		if p != "/etc/ssh/sshd_config" && path.Dir(p) != "/etc/ssh/sshd_config.d" {
			continue
		}
		dropins = append(dropins, p)
		opts := sshdOptions(t, content)
		for k, want := range map[string]string{
			"passwordauthentication":       "no",
			"kbdinteractiveauthentication": "no",
			"permitrootlogin":              "no",
		} {
			if opts[k] != want {
				t.Errorf("%s: %s = %q, want %q", p, k, opts[k], want)
			}
		}
		if v, ok := opts["challengeresponseauthentication"]; ok && v != "no" {
			t.Errorf("%s: ChallengeResponseAuthentication %s", p, v)
		}
		// Debian and Ubuntu images ship 50-cloud-init.conf and
		// 60-cloudimg-settings.conf, which may say "yes".
		if base := path.Base(p); base >= "50-cloud-init.conf" {
			t.Errorf("%s sorts after the images' own drop-ins: their values would win", p)
		}
	}
	if len(dropins) != 1 {
		t.Errorf("sshd drop-ins %v, want exactly one", dropins)
	}
}
