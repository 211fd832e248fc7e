// Package config reads abox.yaml, the declarative description of a sandbox
// that lives next to the code: types, strict loading, defaults and
// validation, and which settings widen what the guest may reach (those need
// the user's trust in the exact file content, see trust.go).
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/abox-dev/abox/internal/termtext"
)

// FileName is the file `abox up` looks for in the current directory.
const FileName = "abox.yaml"

// Version is the only schema version this abox reads.
const Version = 1

// MaxFileBytes bounds abox.yaml: it is someone else's input.
const MaxFileBytes = 256 << 10

// File is abox.yaml. Zero values mean "the hardened default"; pointers
// tell "not set" from an explicit false.
type File struct {
	// Version must be 1.
	Version int `yaml:"version"`
	// Name is the instance name.
	Name string `yaml:"name"`
	// Base is the base image (see `abox base list`).
	Base string `yaml:"base"`
	// CPUs, Memory (MiB) and Disk (GiB) size the guest.
	CPUs   int `yaml:"cpus"`
	Memory int `yaml:"memory"`
	Disk   int `yaml:"disk"`
	// Accel is kvm, tcg or auto.
	Accel string `yaml:"accel"`
	// Allowlist items: lines as in an allowlist file, or a host with its
	// rules (AllowlistItem).
	Allowlist []AllowlistItem `yaml:"allowlist"`
	// AllowlistFile is an allowlist file inside the project, merged with
	// Allowlist.
	AllowlistFile string `yaml:"allowlist_file"`
	// Ports are the destination ports the proxy allows; empty is 80, 443.
	Ports []int `yaml:"ports"`
	// AllowPrivate are address ranges the filters may let the guest reach.
	AllowPrivate []string `yaml:"allow_private"`
	// Mode is the filter mode: active (enforce) or passive (record only).
	Mode string `yaml:"mode"`
	MITM MITM   `yaml:"mitm"`
	DNS  DNS    `yaml:"dns"`
	// UpstreamProxy is the parent proxy the filters' own egress goes through.
	UpstreamProxy UpstreamProxy `yaml:"upstream_proxy"`
	// UpstreamCA is a PEM file inside the project of extra roots the proxy
	// trusts for origin TLS.
	UpstreamCA string    `yaml:"upstream_ca"`
	Monitor    Monitor   `yaml:"monitor"`
	Overrides  Overrides `yaml:"overrides"`
	Provision  Provision `yaml:"provision"`
	// Forwards are HOSTPORT:GUESTPORT forwards from the host's loopback.
	Forwards []string `yaml:"forwards"`
	// Secrets bind secrets of the host's store to the hosts they may go
	// to; names only, never values.
	Secrets []SecretItem `yaml:"secrets"`
}

// AllowlistItem is one item of allowlist, written either as a string, an
// allowlist line ("example.com", "api.github.com GET,HEAD /**"), or as a
// mapping, a host and its rules (AllowlistHost). Exactly one form is set.
type AllowlistItem struct {
	// Line is the string form; "" when the item is a mapping.
	Line string
	AllowlistHost
	// mapping: the item was written as a mapping.
	mapping bool
}

// AllowlistHost is the mapping form of an allowlist item.
type AllowlistHost struct {
	// Host is an allowlist name ("api.github.com", "*.example.com").
	Host string `yaml:"host"`
	// Rules are "[METHOD[,METHOD...]] [PATTERN] [audit]", as after the
	// name on an allowlist line; none means everything on the host.
	Rules []string `yaml:"rules"`
	// Audit puts the whole entry on trial: its rules are tried and what
	// they would refuse is logged, nothing refused (the line "NAME audit").
	Audit bool `yaml:"audit"`
}

// UnmarshalYAML reads either form; Parse's check has refused anything else.
func (a *AllowlistItem) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		return n.Decode(&a.Line)
	}
	a.mapping = true
	return n.Decode(&a.AllowlistHost)
}

// MITM is TLS interception.
type MITM struct {
	// Enabled defaults to true.
	Enabled *bool `yaml:"enabled"`
	// Exceptions are hosts tunnelled instead of intercepted.
	Exceptions []string `yaml:"exceptions"`
}

// DNS is the filters' resolution.
type DNS struct {
	// Upstreams are resolvers IP[:PORT]; empty is the host's.
	Upstreams []string `yaml:"upstreams"`
}

// UpstreamProxy is a parent HTTP proxy for hosts that reach the internet
// only through one.
type UpstreamProxy struct {
	// URL is http://HOST:PORT, without credentials.
	URL string `yaml:"url"`
	// CredentialsFile holds USER:PASSWORD on one line; it is read by the
	// filters, never put on a command line. A host path (~ expands).
	CredentialsFile string `yaml:"credentials_file"`
}

// Monitor is the in-guest runtime monitor.
type Monitor struct {
	Enabled bool `yaml:"enabled"`
	// Bundle is a Tetragon bundle file inside the project (upstream's
	// linux-tarball layout), or "release" for the pinned upstream release;
	// setting it turns the monitor on.
	Bundle string `yaml:"bundle"`
}

// Overrides replace hardened defaults.
type Overrides struct {
	Libvirt LibvirtOverrides `yaml:"libvirt"`
}

// LibvirtOverrides replace parts of the libvirt definition.
type LibvirtOverrides struct {
	// Template is a domain template file inside the project that replaces
	// the hardened domain.
	Template string `yaml:"template"`
}

// Provision runs on the first boot (and with `abox up --provision`).
type Provision struct {
	// Overlay is a directory inside the project copied into the guest's /.
	Overlay string `yaml:"overlay"`
	// Scripts inside the project run as root in order.
	Scripts []string `yaml:"scripts"`
}

// Error is a problem at a place in the file.
type Error struct {
	Source       string
	Line, Column int
	Msg          string
}

// Error renders the problem for the operator's terminal. Its text quotes
// the file (yaml.v3's own messages, values of every type), so each line is
// cleaned of terminal controls here, once for every message.
func (e *Error) Error() string {
	s := fmt.Sprintf("%s:%d:%d: %s", e.Source, e.Line, e.Column, e.Msg)
	if e.Line == 0 {
		s = fmt.Sprintf("%s: %s", e.Source, e.Msg)
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = termtext.Clean(l)
	}
	return strings.Join(lines, "\n")
}

// Parse reads abox.yaml strictly: one document, no anchors or aliases (no
// billion-laughs expansion, no surprises in review), every key known to this
// version (an unknown one is an error with a "did you mean"), every value
// of its type, no key twice.
func Parse(r io.Reader, source string) (*Doc, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", source, err)
	}
	if len(b) > MaxFileBytes {
		return nil, &Error{Source: source, Msg: fmt.Sprintf("larger than %d bytes", MaxFileBytes)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{Source: source, Msg: "empty file (start with `version: 1`; `abox init` writes a starter)"}
		}
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if strings.Contains(msg, "did not find expected alphabetic or numeric character") {
			// yaml.v3's words for an alias with no name: what an unquoted
			// wildcard entry reads as.
			msg += ` (a value that starts with * is an alias to YAML: quote it, as in - "*.example.com")`
		}
		return nil, &Error{Source: source, Msg: msg}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		line := extra.Line
		return nil, &Error{Source: source, Line: line, Column: 1, Msg: "more than one YAML document; abox.yaml holds one"}
	}
	if len(doc.Content) != 1 {
		return nil, &Error{Source: source, Msg: "empty file (start with `version: 1`)"}
	}
	root := doc.Content[0]
	d := &Doc{Source: source, Raw: b, pos: map[string]pos{}}
	if err := check(root, reflect.TypeOf(File{}), "", source, d.pos); err != nil {
		return nil, err
	}
	if err := checkVersion(root, source); err != nil {
		return nil, err
	}
	if err := root.Decode(&d.File); err != nil {
		return nil, &Error{Source: source, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	return d, nil
}

// Doc is a parsed abox.yaml with where each value was written.
type Doc struct {
	File   File
	Source string
	// Raw is the file's bytes, as hashed for trust.
	Raw []byte
	pos map[string]pos
}

type pos struct{ line, col int }

// errAt is an error about the value at key path (as "mitm.exceptions[1]").
func (d *Doc) errAt(path, format string, args ...any) error {
	p := d.pos[path]
	return &Error{Source: d.Source, Line: p.line, Column: p.col, Msg: path + ": " + fmt.Sprintf(format, args...)}
}

func checkVersion(root *yaml.Node, source string) error {
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "version" {
			v := root.Content[i+1]
			if v.Value != "1" {
				return &Error{Source: source, Line: v.Line, Column: v.Column, Msg: fmt.Sprintf("version %s is not supported by this abox (it reads version %d); upgrade abox or rewrite the file for version %d", v.Value, Version, Version)}
			}
			return nil
		}
	}
	return &Error{Source: source, Line: root.Line, Column: root.Column, Msg: fmt.Sprintf("no version; add `version: %d` as the first line", Version)}
}

// check walks the node against the Go type, by the yaml tags.
func check(n *yaml.Node, t reflect.Type, path, source string, at0 map[string]pos) error {
	at0[path] = pos{n.Line, n.Column}
	at := func(n *yaml.Node, format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		if path != "" {
			msg = path + ": " + msg
		}
		return &Error{Source: source, Line: n.Line, Column: n.Column, Msg: msg}
	}
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return at(n, "anchors and aliases (&, *) are not allowed in abox.yaml; write the value out")
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[[]SecretItem]() || t == reflect.TypeFor[SecretItem]() {
		if err := checkSecretNode(n, t.Kind() == reflect.Slice, path, source); err != nil {
			return err
		}
	}
	if t == reflect.TypeFor[AllowlistItem]() {
		// A string is an allowlist line, a mapping a host and its rules.
		t = reflect.TypeFor[AllowlistHost]()
		if n.Kind == yaml.ScalarNode {
			t = reflect.TypeFor[string]()
		} else if n.Kind != yaml.MappingNode {
			return at(n, "want an allowlist line (\"api.github.com GET,HEAD /**\") or a mapping (host, rules, audit), got %s", describe(n))
		}
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return at(n, "want a mapping of keys (%s), got %s", strings.Join(fieldNames(t), ", "), describe(n))
		}
		fields := map[string]reflect.StructField{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			fields[strings.Split(f.Tag.Get("yaml"), ",")[0]] = f
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
				return at(k, "keys must be plain names (no merge keys or complex keys)")
			}
			kp := k.Value
			if path != "" {
				kp = path + "." + k.Value
			}
			f, ok := fields[k.Value]
			if !ok {
				msg := fmt.Sprintf("unknown key %q", kp)
				if s := suggest(k.Value, fieldNames(t)); s != "" {
					msg += fmt.Sprintf(" (did you mean %q?)", s)
				} else {
					msg += fmt.Sprintf(" (known here: %s)", strings.Join(fieldNames(t), ", "))
				}
				return &Error{Source: source, Line: k.Line, Column: k.Column, Msg: msg}
			}
			if seen[k.Value] {
				return &Error{Source: source, Line: k.Line, Column: k.Column, Msg: fmt.Sprintf("%q appears twice", kp)}
			}
			seen[k.Value] = true
			if err := check(v, f.Type, kp, source, at0); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return nil
		}
		if n.Kind != yaml.SequenceNode {
			return at(n, "want a list, got %s", describe(n))
		}
		for i, c := range n.Content {
			if err := check(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), source, at0); err != nil {
				return err
			}
		}
		return nil
	case reflect.String:
		if err := scalar(n, "!!str", "a string", at); err != nil {
			return err
		}
		// Values reach the operator's terminal (the trust prompt names
		// paths): an escape sequence in one could erase or rewrite the
		// lines that list what the file widens.
		if err := termtext.Check(n.Value); err != nil {
			return at(n, "%q: %v; abox.yaml values are printable text", n.Value, err)
		}
		return nil
	case reflect.Int:
		return scalar(n, "!!int", "an integer", at)
	case reflect.Bool:
		return scalar(n, "!!bool", "true or false", at)
	}
	return at(n, "unsupported type %s", t)
}

func scalar(n *yaml.Node, tag, want string, at func(*yaml.Node, string, ...any) error) error {
	if n.Kind != yaml.ScalarNode {
		return at(n, "want %s, got %s", want, describe(n))
	}
	if n.Tag == "!!null" {
		return nil
	}
	if n.Tag != tag {
		hint := ""
		if tag == "!!bool" && n.Tag == "!!str" {
			hint = " (YAML 1.2: write true or false, not yes/no/on/off)"
		}
		return at(n, "want %s, got %s%s", want, describe(n), hint)
	}
	return nil
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!int":
			return "the integer " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!null":
			return "nothing"
		}
		return fmt.Sprintf("%q (%s)", n.Value, n.Tag)
	}
	return "an unexpected node"
}

func fieldNames(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		out = append(out, strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0])
	}
	sort.Strings(out)
	return out
}

// suggest returns the known key closest to k, if it is close enough to be
// a typo.
func suggest(k string, known []string) string {
	best, bestD := "", 1<<30
	for _, c := range known {
		if d := levenshtein(strings.ToLower(k), c); d < bestD {
			best, bestD = c, d
		}
	}
	if bestD <= max(2, len(k)/3) {
		return best
	}
	return ""
}

func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
