package config

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/reqrules"
	"github.com/abox-dev/abox/internal/secrets"
	"github.com/abox-dev/abox/internal/termtext"
)

// MaxSecrets bounds the bindings one abox.yaml may name.
const MaxSecrets = 64

// SecretItem is one item of secrets: a secret of the host's store (abox
// secret set) and where the instance's proxy may send it, in the terms of
// abox secret bind. It names the secret; its value never goes in the file.
type SecretItem struct {
	// Name is the secret's name in the store, and the guest's variable
	// holding its placeholder.
	Name string `yaml:"name"`
	// Host is "api.example.com", "*.example.com" or either with ":PORT".
	Host string `yaml:"host"`
	// Rules are reqrules lines ("POST /v1/**"); none is every request.
	Rules []string `yaml:"rules"`
	// Exactly one of Bearer, Basic (the user) and Header says how the
	// value is sent.
	Bearer bool   `yaml:"bearer"`
	Basic  string `yaml:"basic"`
	Header string `yaml:"header"`
}

// Secret is a validated secrets item.
type Secret struct {
	// Name passed secrets.CheckName.
	Name string
	// Binding is the binding for the file's instance (Binding.Instance is
	// Config.Name), as secrets.ParseBinding made it.
	Binding secrets.Binding
	// Key is the item's key path ("secrets[0]") and Line its line.
	Key  string
	Line int
}

// String is the binding as the trust prompt shows it: never a value.
func (s Secret) String() string {
	b := s.Binding
	b.Instance = ""
	return s.Name + " " + strings.TrimPrefix(b.String(), " ")
}

// valueKeys are keys someone who puts a value in the file would write.
var valueKeys = []string{"value", "secret", "token", "password", "passwd", "pass", "key",
	"api_key", "apikey", "credential", "credentials", "from_file", "file", "command"}

// valueHint is said wherever a value looks to be in the file.
const valueHint = "abox.yaml names secrets, never their values (everyone with the repository reads it); store the value on the host with `abox secret set NAME` and keep only name, host, rules and bearer/basic/header here"

// tokenPrefixes start well-known credentials.
var tokenPrefixes = []string{"sk-", "sk_", "ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_",
	"glpat-", "xoxb-", "xoxp-", "xoxa-", "akia", "aiza", "npm_", "pypi-", "bearer ", "basic ", "eyj"}

var opaquePattern = regexp.MustCompile(`^[A-Za-z0-9_+/=.-]{24,}$`)

// looksLikeValue reports whether s reads as a credential rather than a
// name, host, header or rule: a known token prefix, or a long opaque
// string mixing cases and digits without a dot.
func looksLikeValue(s string) bool {
	l := strings.ToLower(s)
	for _, p := range tokenPrefixes {
		if strings.HasPrefix(l, p) && len(s) > len(p)+4 {
			return true
		}
	}
	if !opaquePattern.MatchString(s) || strings.Contains(s, ".") {
		return false
	}
	var lower, upper, digit bool
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z':
			lower = true
		case c >= 'A' && c <= 'Z':
			upper = true
		case c >= '0' && c <= '9':
			digit = true
		}
	}
	return lower && upper && digit
}

// checkSecretNode refuses, without quoting it, what reads as a value
// under secrets: the section or an item not in its shape, a key that
// holds a value, a string that looks like a credential. It runs before
// the generic walk, whose messages quote what they find.
func checkSecretNode(n *yaml.Node, list bool, path, source string) error {
	at := func(n *yaml.Node, format string, args ...any) error {
		return &Error{Source: source, Line: n.Line, Column: n.Column, Msg: path + ": " + fmt.Sprintf(format, args...)}
	}
	kind := "a value"
	switch {
	case n.Kind == yaml.MappingNode:
		kind = "a mapping"
	case n.Kind == yaml.SequenceNode:
		kind = "a list"
	case n.Kind == yaml.ScalarNode && n.Tag == "!!null":
		kind = "nothing"
	}
	if list {
		if kind != "a list" && kind != "nothing" {
			return at(n, "want a list of bindings (- name: OPENAI_API_KEY, host: api.openai.com, bearer: true), got %s; %s", kind, valueHint)
		}
		return nil
	}
	if kind != "a mapping" {
		return at(n, "want a mapping (name, host, rules, bearer, basic, header), got %s; %s", kind, valueHint)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && slices.Contains(valueKeys, strings.ToLower(k.Value)) {
			return &Error{Source: source, Line: k.Line, Column: k.Column, Msg: fmt.Sprintf("%s.%s: %s", path, termtext.Clean(k.Value), valueHint)}
		}
		vals := []*yaml.Node{v}
		if v.Kind == yaml.SequenceNode {
			vals = v.Content
		}
		for _, s := range vals {
			if k.Value == "host" && isHostName(s.Value) {
				continue // "sk-proxy.example.com" is a host, not a key
			}
			if s.Kind == yaml.ScalarNode && looksLikeValue(s.Value) {
				return &Error{Source: source, Line: s.Line, Column: s.Column, Msg: fmt.Sprintf("%s.%s: this looks like a credential, not a name (it is not repeated here); %s", path, termtext.Clean(k.Value), valueHint)}
			}
		}
	}
	return nil
}

// isHostName reports whether s is a dotted allowlist name, with or
// without a port: a host, whatever its first label looks like.
func isHostName(s string) bool {
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		s = s[:i]
	}
	if !strings.Contains(s, ".") {
		return false
	}
	_, err := allowlist.ParseEntry(s)
	return err == nil
}

// yamlWords turns the wording of abox secret bind's flags, which
// secrets.ParseBinding's errors use, into the file's keys.
var yamlWords = strings.NewReplacer("--bearer", "bearer: true", "--basic USER", "basic: USER",
	"--header NAME", "header: NAME", "--rule", "rules", "--host", "host:")

// secretList validates the secrets items for instance name.
func (d *Doc) secretList(name string, items []SecretItem) ([]Secret, error) {
	if len(items) > MaxSecrets {
		return nil, d.errAt("secrets", "%d bindings; at most %d", len(items), MaxSecrets)
	}
	var out []Secret
	for i, it := range items {
		key := fmt.Sprintf("secrets[%d]", i)
		if it.Name == "" {
			return nil, d.errAt(key, "no name; write `name: NAME`, the secret's name in `abox secret list`")
		}
		if err := secrets.CheckName(it.Name); err != nil {
			return nil, d.errAt(key+".name", "%v", err)
		}
		if it.Host == "" {
			return nil, d.errAt(key, "no host; write `host: NAME`, the API host the secret may go to, such as api.openai.com")
		}
		if strings.Contains(it.Basic, ":") {
			// "user:password" (not repeated: the part after : is a value).
			return nil, d.errAt(key+".basic", "holds ':'; basic is the user name only, the password is the secret's value: store it with `abox secret set %s`", it.Name)
		}
		n := 0
		for _, set := range []bool{it.Bearer, it.Basic != "", it.Header != ""} {
			if set {
				n++
			}
		}
		if n != 1 {
			return nil, d.errAt(key, "say how %s is sent with exactly one of bearer: true, basic: USER or header: NAME (got %d)", it.Name, n)
		}
		spec := secrets.BindingSpec{Instance: name, Host: it.Host, Bearer: it.Bearer, Basic: it.Basic, Header: it.Header}
		// Each part alone first, so that the error names its key.
		if _, err := secrets.ParseBinding(secrets.BindingSpec{Instance: name, Host: it.Host, Bearer: true}); err != nil {
			return nil, d.errAt(key+".host", "%s", yamlWords.Replace(err.Error()))
		}
		for j, r := range it.Rules {
			if _, err := secrets.ParseBinding(secrets.BindingSpec{Instance: name, Host: it.Host, Bearer: true, Rules: []string{r}}); err != nil {
				return nil, d.errAt(fmt.Sprintf("%s.rules[%d]", key, j), "%s", yamlWords.Replace(err.Error()))
			}
		}
		if _, given := d.pos[key+".rules"]; given && len(it.Rules) == 0 {
			return nil, d.errAt(key+".rules", "no rules; leave rules out to send %s on every request to %s, or list them (\"POST /v1/**\")", it.Name, it.Host)
		}
		spec.Rules = it.Rules
		b, err := secrets.ParseBinding(spec)
		if err != nil {
			at := key
			switch {
			case it.Basic != "":
				at = key + ".basic"
			case it.Header != "":
				at = key + ".header"
			}
			return nil, d.errAt(at, "%s", yamlWords.Replace(err.Error()))
		}
		s := Secret{Name: it.Name, Binding: b, Key: key, Line: d.pos[key].line}
		for _, o := range out {
			if o.Name == s.Name && o.Binding.Host == b.Host && o.Binding.Port == b.Port {
				return nil, d.errAt(key, "%s is bound to %s at %s (line %d) already; one binding per secret and host: merge their rules", s.Name, b.Host, o.Key, o.Line)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// checkSecretReach refuses a binding no request could use: to a host the
// merged allowlist does not allow, on a port the proxy does not open, or
// to a host the proxy tunnels unseen (a secret is added only on
// intercepted TLS).
func (p *Project) checkSecretReach() error {
	allow := p.AllowlistList()
	ports := p.Ports
	if len(ports) == 0 {
		ports = []uint16{80, 443}
	}
	for _, s := range p.Secrets {
		b := s.Binding
		probe := b.Host
		if w, ok := strings.CutPrefix(b.Host, "*."); ok {
			probe = "abox-secret-probe." + w
		}
		if dn := allow.MatchNormalized(probe); dn.Verdict != allowlist.Allow {
			what := b.Host
			if probe != b.Host {
				what = "every name below " + strings.TrimPrefix(b.Host, "*.")
			}
			return p.Doc.errAt(s.Key+".host", "%s: the allowlist does not allow %s, so no request could carry %s there; add `- %q` to allowlist, or bind a host it allows", b.Host, what, s.Name, b.Host)
		}
		if !slices.Contains(ports, b.Port) {
			return p.Doc.errAt(s.Key+".host", "%s: port %d is not among the proxy's ports (%s); add it to ports, or bind the port the API listens on", b.Host, b.Port, portList(ports))
		}
		if p.NoMITM {
			return p.Doc.errAt(s.Key, "%s: mitm.enabled is false, so HTTPS is tunnelled unseen and the proxy could never add the secret; turn interception on or drop the binding", s.Name)
		}
		for _, h := range p.MITMExceptions {
			if allowlist.New([]allowlist.Entry{mustEntry(b.Host)}).MatchNormalized(h).Verdict == allowlist.Allow {
				return p.Doc.errAt(s.Key, "%s: %s is in mitm.exceptions, tunnelled unseen, so the proxy could never add the secret; drop the exception or the binding", s.Name, h)
			}
		}
	}
	return nil
}

func portList(ps []uint16) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ", ")
}

// mustEntry parses a host secrets.ParseBinding accepted.
func mustEntry(host string) allowlist.Entry {
	e, err := allowlist.ParseEntry(host)
	if err != nil {
		panic(err)
	}
	return e
}

// SecretError is an error about secrets item s, at its line.
func (p *Project) SecretError(s Secret, format string, args ...any) error {
	return p.Doc.errAt(s.Key+".name", format, args...)
}

// secretBaseline is a binding as a trust record keeps it: the instance
// left out (a renamed instance of the same file is the same permission).
type secretBaseline struct {
	Name    string          `json:"name"`
	Binding secrets.Binding `json:"binding"`
}

func secretBaselines(ss []Secret) []secretBaseline {
	out := make([]secretBaseline, len(ss))
	for i, s := range ss {
		b := s.Binding
		b.Instance = ""
		out[i] = secretBaseline{Name: s.Name, Binding: b}
	}
	return out
}

// secretWidenings lists the bindings of now that a binding of prev does
// not cover: a secret bound to a new host, a wider host (a wildcard), a
// new port, more methods or paths, or sent another way.
func secretWidenings(prev []secretBaseline, now []Secret) ([]Widening, error) {
	var out []Widening
	for _, s := range now {
		covered := false
		for _, pb := range prev {
			ok, err := bindingCovers(pb, s)
			if err != nil {
				return nil, err
			}
			if ok {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, Widening{Key: "secrets", Why: "sends " + s.String() + " (not covered by the bindings trusted)"})
		}
	}
	return out, nil
}

// bindingCovers reports whether the trusted binding p allows every
// request s would send the secret on, in the same header.
func bindingCovers(p secretBaseline, s Secret) (bool, error) {
	pb, sb := p.Binding, s.Binding
	if p.Name != s.Name || pb.Port != sb.Port || pb.Send != sb.Send || pb.Header != sb.Header || pb.User != sb.User {
		return false, nil
	}
	pe, err := allowlist.ParseEntry(pb.Host)
	if err != nil {
		return false, fmt.Errorf("trusted binding host %q: %w", pb.Host, err)
	}
	probe := sb.Host
	if w, ok := strings.CutPrefix(sb.Host, "*."); ok {
		probe = "abox-secret-probe." + w
	}
	if allowlist.New([]allowlist.Entry{pe}).MatchNormalized(probe).Verdict != allowlist.Allow {
		return false, nil
	}
	ps, err := ruleSet(pb)
	if err != nil {
		return false, err
	}
	ss, err := ruleSet(sb)
	if err != nil {
		return false, err
	}
	return ps.Covers(ss), nil
}

func ruleSet(b secrets.Binding) (*reqrules.Set, error) {
	if len(b.Rules) == 0 {
		return nil, nil
	}
	rs := make([]reqrules.Rule, len(b.Rules))
	for i, s := range b.Rules {
		r, err := reqrules.ParseRule(s)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("trusted binding rule %q", s), err)
		}
		rs[i] = r
	}
	return reqrules.NewSet(b.Host, rs), nil
}
