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
