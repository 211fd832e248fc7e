package cloudinit

import (
	"fmt"
	"path"
	"strings"
)

// Tetragon in a monitored guest (create --monitor-bundle): abox installs
// the agent from a bundle it checked on the host, with a unit of its own
// and a default tracing policy, writing its JSON export where the
// forwarder reads (MonitorExport).

const (
	TetragonUnit      = "abox-tetragon.service"
	TetragonPolicyDir = "/etc/tetragon/tetragon.tp.d"
	TetragonBPFDir    = "/usr/local/lib/tetragon/bpf"
	TetragonSocket    = "/var/run/tetragon/tetragon.sock"
	// TetragonMarker holds the sha256 of the bundle installed.
	TetragonMarker = "/usr/local/lib/abox/tetragon-bundle.sha256"
)

const tetragonUnit = `[Unit]
Description=Tetragon, installed by abox: exec, sensitive-file and connect events for the host monitor
After=local-fs.target
ConditionPathExists=/usr/local/bin/tetragon
StartLimitBurst=10
StartLimitIntervalSec=2min

[Service]
Environment="PATH=/usr/local/lib/tetragon:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ExecStartPre=/bin/mkdir -p ` + "/var/log/tetragon /var/run/tetragon" + `
ExecStart=/usr/local/bin/tetragon --bpf-lib ` + TetragonBPFDir + `/ --export-filename ` + MonitorExport + ` --server-address unix://` + TetragonSocket + ` --tracing-policy-dir ` + TetragonPolicyDir + `
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
`

// TetragonPolicies are abox's default tracing policies for a guest whose
// login user is user, by file name. Process exec and exit need no policy
// (Tetragon always reports them).
func TetragonPolicies(user string) map[string]string {
	home := "/home/" + user + "/"
	var prefixes strings.Builder
	for _, p := range []string{
		"/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh/", "/etc/ssl/private/", "/root/",
		home + ".ssh/", home + ".aws/", home + ".config/gcloud/", home + ".gnupg/", home + ".docker/config.json",
		home + ".netrc", home + ".git-credentials", home + ".kube/",
	} {
		fmt.Fprintf(&prefixes, "        - %q\n", p)
	}
	return map[string]string{
		// security_file_permission sees every read and write of an open
		// file; its mask says which (MAY_READ 4, MAY_WRITE 2).
		"abox-sensitive-files.yaml": `apiVersion: cilium.io/v1alpha1
kind: TracingPolicy
metadata:
  name: "abox-sensitive-files"
spec:
  kprobes:
  - call: "security_file_permission"
    syscall: false
    args:
    - index: 0
      type: "file"
    - index: 1
      type: "int"
    selectors:
    - matchArgs:
      - index: 0
        operator: "Prefix"
        values:
` + prefixes.String() + `    - matchArgs:
      - index: 0
        operator: "Postfix"
        values:
        - "/.env"
        - ".pem"
        - "id_rsa"
        - "id_ed25519"
`,
		"abox-connects.yaml": `apiVersion: cilium.io/v1alpha1
kind: TracingPolicy
metadata:
  name: "abox-connects"
spec:
  kprobes:
  - call: "tcp_connect"
    syscall: false
    args:
    - index: 0
      type: "sock"
`,
	}
}

// TetragonAgentCommand is the guest command (run by the login user over
// SSH) that installs the bundle arriving on its stdin, whose sha256 is sha
// and whose layout sits below prefix ("" or one directory), then enables
// and starts Tetragon and the forwarder. When the bundle of that digest is
// already installed it reads nothing and exits 3 unless asked to start
// (see TetragonStartCommand). The host checked the bundle (names, links,
// types); the guest checks that what arrived is what was checked.
func TetragonAgentCommand(sha, prefix, user string) string {
	return "sudo -n sh -c " + ShellQuote(tetragonInstallScript(sha, prefix, user))
}

func tetragonInstallScript(sha, prefix, user string) string {
	var b strings.Builder
	b.WriteString(`set -eu
umask 022
want=` + sha + `
# One setup at a time (a start --no-wait's and a later start's); the one
# that waited finds the bundle installed and only starts the units.
exec 9>/run/abox-tetragon.lock
flock 9
if [ "$(cat ` + TetragonMarker + ` 2>/dev/null)" = "$want" ]; then
	cat >/dev/null
	systemctl enable --now ` + TetragonUnit + ` ` + MonitorUnit + ` >/dev/null 2>&1
	exit 0
fi
d=$(mktemp -d /var/tmp/abox-tetragon.XXXXXX)
trap 'rm -rf "$d"' EXIT
cat >"$d/bundle.tar.gz"
got=$(sha256sum "$d/bundle.tar.gz" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then echo "abox: the bundle arrived with sha256 $got, want $want" >&2; exit 1; fi
mkdir "$d/x"
tar -xzf "$d/bundle.tar.gz" -C "$d/x" --no-same-owner --no-same-permissions
s="$d/x"/` + ShellQuote(path.Join(".", prefix)) + `
install -d -m 0755 /usr/local/bin /usr/local/lib/tetragon /usr/local/lib/abox ` + TetragonPolicyDir + ` /var/log/tetragon
systemctl stop ` + TetragonUnit + ` 2>/dev/null || true
install -m 0755 "$s/usr/local/bin/tetragon" /usr/local/bin/tetragon
if [ -f "$s/usr/local/bin/tetra" ]; then install -m 0755 "$s/usr/local/bin/tetra" /usr/local/bin/tetra; fi
rm -rf ` + TetragonBPFDir + `.new
cp -R "$s/usr/local/lib/tetragon/bpf" ` + TetragonBPFDir + `.new
chown -R root:root ` + TetragonBPFDir + `.new
chmod -R go-w ` + TetragonBPFDir + `.new
rm -rf ` + TetragonBPFDir + `
mv ` + TetragonBPFDir + `.new ` + TetragonBPFDir + `
`)
	pol := TetragonPolicies(user)
	for _, name := range []string{"abox-connects.yaml", "abox-sensitive-files.yaml"} {
		fmt.Fprintf(&b, "cat >%s/%s <<'ABOX_EOF'\n%sABOX_EOF\n", TetragonPolicyDir, name, pol[name])
	}
	fmt.Fprintf(&b, "cat >/etc/systemd/system/%s <<'ABOX_EOF'\n%sABOX_EOF\n", TetragonUnit, tetragonUnit)
	b.WriteString(`echo "$want" >` + TetragonMarker + `
systemctl daemon-reload
systemctl enable ` + TetragonUnit + ` ` + MonitorUnit + ` >/dev/null 2>&1
systemctl restart ` + TetragonUnit + `
systemctl start ` + MonitorUnit + `
`)
	return b.String()
}

// TetragonStartCommand enables and starts Tetragon and the forwarder when
// the bundle of digest sha is installed, and exits 3 when it is not.
func TetragonStartCommand(sha string) string {
	return "sudo -n sh -c " + ShellQuote(`[ "$(cat `+TetragonMarker+` 2>/dev/null)" = "`+sha+`" ] || exit 3
systemctl enable --now `+TetragonUnit+` `+MonitorUnit+` >/dev/null 2>&1`)
}

// ShellQuote quotes s for a POSIX shell.
func ShellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
