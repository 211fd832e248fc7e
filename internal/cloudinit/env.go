package cloudinit

import (
	"fmt"
	"strings"
)

// ProxyEnvironment is the proxy and CA environment the guest's shells and
// services get from the seed, for host-side code that runs commands in the
// guest (provisioning) and must give them the same settings.
func ProxyEnvironment(c Config) [][2]string { return proxyEnv(c) }

// javaProxyOptions are the JVM's proxy system properties for the instance
// proxy. The JVM's default http.nonProxyHosts already keeps localhost and
// 127.* direct.
func javaProxyOptions(c Config) string {
	h, p := c.Gateway.String(), c.ProxyPort
	return fmt.Sprintf("-Dhttp.proxyHost=%s -Dhttp.proxyPort=%d -Dhttps.proxyHost=%s -Dhttps.proxyPort=%d", h, p, h, p)
}

// plainValue reports whether v needs no quoting: URL, path and list
// characters only.
func plainValue(v string) bool {
	return v != "" && strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:/._,-=") == ""
}

// shellValue quotes v for /etc/profile.d (sh).
func shellValue(v string) string {
	if plainValue(v) {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// pamEnvValue quotes v for /etc/environment (pam_env), which takes a
// double-quoted value without escapes; the values here never hold one.
func pamEnvValue(v string) string {
	if plainValue(v) {
		return v
	}
	return `"` + strings.ReplaceAll(v, `"`, "") + `"`
}

// Paths of the files that carry the proxy environment past sudo and into
// services.
const (
	sudoersProxyFile = "/etc/sudoers.d/90-abox-proxy" // no dot: sudo skips such names in sudoers.d
	systemdProxyFile = "/etc/systemd/system.conf.d/90-abox-proxy.conf"
	userdProxyFile   = "/etc/systemd/user.conf.d/90-abox-proxy.conf"
)

// sudoersEnvKeep keeps the proxy environment through sudo. Debian's sudoers
// resets the environment (env_reset) and its PAM stack for sudo does not
// read /etc/environment, so without this `sudo curl` or `sudo npm install`
// would go direct, past the proxy, and hang until the packet filter's drop
// timed out. Only names are listed: the values are the caller's.
func sudoersEnvKeep(c Config) string {
	var names []string
	for _, kv := range proxyEnv(c) {
		names = append(names, kv[0])
	}
	return "# Written by abox: keep the proxy settings through sudo.\nDefaults env_keep += \"" + strings.Join(names, " ") + "\"\n"
}

// systemdEnvironment is a system.conf (and user.conf) drop-in giving every
// service the proxy environment: systemd's managers do not read
// /etc/environment or /etc/profile.d. The managers read it when they start
// and on daemon-reload; on the first boot the seed is written after the
// system manager started, and the base image reloads it once (see
// image.Debian12Recipe).
func systemdEnvironment(c Config) string {
	var b strings.Builder
	b.WriteString("# Written by abox: every service reaches the network through the instance proxy.\n[Manager]\nDefaultEnvironment=")
	for i, kv := range proxyEnv(c) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(systemdValue(kv[0] + "=" + kv[1]))
	}
	b.WriteByte('\n')
	return b.String()
}

// systemdValue quotes one NAME=value word for a systemd setting that takes
// a list of assignments (C escapes, double quotes).
func systemdValue(v string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(v) + `"`
}
