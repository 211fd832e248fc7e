package instance

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/paths"
)

// TestSSHArgsShareNothingWithTheGuest: the guest runs the sshd, so abox
// ssh must switch off everything that would hand it something of the
// host's (agent, X11, forwardings, credentials, a shared master), and keep
// the pinned host key the only one trusted, whatever ssh_config says.
func TestSSHArgsShareNothingWithTheGuest(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	st := State{Name: "dev", User: "abox", GuestIP: netip.MustParseAddr("10.10.5.10")}
	f := l.Instance(st.Name)
	if err := os.MkdirAll(filepath.Dir(f.SSHKey), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.SSHKey, []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	args, err := SSHArgs(l, st, []string{"id", "-u"})
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string]string{}
	dest := -1
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "-o":
			k, v, _ := strings.Cut(args[i+1], "=")
			opts[strings.ToLower(k)] = v
			i++
		case "-i":
			i++
		default:
			if dest < 0 {
				dest = i
			}
		}
	}
	want := map[string]string{
		"userknownhostsfile":        f.KnownHosts,
		"stricthostkeychecking":     "yes",
		"globalknownhostsfile":      "/dev/null",
		"updatehostkeys":            "no",
		"forwardagent":              "no",
		"identityagent":             "none",
		"forwardx11":                "no",
		"forwardx11trusted":         "no",
		"clearallforwardings":       "yes",
		"tunnel":                    "no",
		"gssapiauthentication":      "no",
		"gssapidelegatecredentials": "no",
		"controlmaster":             "no",
		"controlpath":               "none",
		"proxycommand":              "none",
		"permitlocalcommand":        "no",
		"identitiesonly":            "yes",
		"passwordauthentication":    "no",
	}
	for k, v := range want {
		if opts[k] != v {
			t.Errorf("ssh option %s = %q, want %q", k, opts[k], v)
		}
	}
	if dest < 0 || args[dest] != "abox@10.10.5.10" || strings.Join(args[dest+1:], " ") != "-- id -u" {
		t.Errorf("destination and command = %q, want abox@10.10.5.10 -- id -u after every option", args[max(dest, 0):])
	}
	// Every option must be one the installed ssh understands (ssh -G
	// parses them without connecting).
	if ssh, err := exec.LookPath("ssh"); err == nil {
		g := append([]string{"-G"}, args[:dest+1]...)
		if out, err := exec.Command(ssh, g...).CombinedOutput(); err != nil {
			t.Errorf("ssh -G rejects the arguments: %v\n%s", err, out)
		}
	}
}
