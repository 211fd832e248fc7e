package cloudinit

import (
	"fmt"
	"regexp"
	"strings"
)

// Placeholder environment: the names of secrets bound for the instance
// with their placeholders (internal/secrets). The values stay on the host;
// the seed may only ever carry placeholders, so Validate refuses anything
// else without quoting it (it could be a value passed by mistake).
var (
	placeholderNamePattern  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
	placeholderValuePattern = regexp.MustCompile(`^abox-ph-[0-9a-f]{32}$`)
)

// Files that carry the placeholders: login shells, pam_env sessions and
// services (the same three routes as the proxy settings).
const (
	profileSecretsFile = "/etc/profile.d/abox-secrets.sh"
	systemdSecretsFile = "/etc/systemd/system.conf.d/91-abox-secrets.conf"
	userdSecretsFile   = "/etc/systemd/user.conf.d/91-abox-secrets.conf"
)

func checkPlaceholders(env [][2]string) []error {
	var errs []error
	seen := map[string]bool{}
	for _, kv := range env {
		switch {
		case !placeholderNamePattern.MatchString(kv[0]):
			errs = append(errs, fmt.Errorf("placeholder name %q: want an environment variable name, such as OPENAI_API_KEY", kv[0]))
		case seen[kv[0]]:
			errs = append(errs, fmt.Errorf("placeholder %s: given twice", kv[0]))
		case !placeholderValuePattern.MatchString(kv[1]):
			errs = append(errs, fmt.Errorf("placeholder %s: not abox-ph- and 32 hex digits; only placeholders go in the seed, never a secret's value", kv[0]))
		}
		seen[kv[0]] = true
	}
	return errs
}

// placeholderFiles are the write_files entries of c's placeholders, and
// the lines for /etc/environment.
func placeholderFiles(c Config) ([]fileSpec, string) {
	if len(c.Placeholders) == 0 {
		return nil, ""
	}
	var profile, environment, systemd strings.Builder
	profile.WriteString("# Written by abox: placeholders of secrets the proxy injects (abox secret list).\n")
	environment.WriteString("# abox secret placeholders\n")
	systemd.WriteString("# Written by abox: placeholders of secrets the proxy injects.\n[Manager]\nDefaultEnvironment=")
	for i, kv := range c.Placeholders {
		fmt.Fprintf(&profile, "export %s=%s\n", kv[0], kv[1])
		fmt.Fprintf(&environment, "%s=%s\n", kv[0], kv[1])
		if i > 0 {
			systemd.WriteByte(' ')
		}
		systemd.WriteString(systemdValue(kv[0] + "=" + kv[1]))
	}
	systemd.WriteByte('\n')
	return []fileSpec{
		{Path: profileSecretsFile, Owner: "root:root", Permissions: "0644", Content: profile.String()},
		{Path: systemdSecretsFile, Owner: "root:root", Permissions: "0644", Content: systemd.String()},
		{Path: userdSecretsFile, Owner: "root:root", Permissions: "0644", Content: systemd.String()},
	}, environment.String()
}
