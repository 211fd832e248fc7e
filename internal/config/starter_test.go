package config

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
)

// keyPaths lists every key of version 1 as a dotted path.
func keyPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		k := prefix + strings.Split(f.Tag.Get("yaml"), ",")[0]
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			out = append(out, keyPaths(ft, k+".")...)
		} else {
			out = append(out, k)
		}
	}
	return out
}

// TestStarterIsValidAndNamesEveryKey: `abox init`'s file loads as written,
// with every preset, widens only the allowlist, and shows every key (the help topic
// prints it).
func TestStarterIsValidAndNamesEveryKey(t *testing.T) {
	var all []string
	for _, p := range Presets() {
		all = append(all, p.Name)
	}
	text, err := Starter("dev", all)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(strings.NewReader(text), "abox.yaml")
	if err != nil {
		t.Fatalf("starter does not parse: %v\n%s", err, text)
	}
	c, err := d.Validate()
	if err != nil {
		t.Fatal(err)
	}
	// The presets' names are the only thing it widens (abox init trusts
	// the file it writes).
	if w := c.Widenings(); len(w) != 1 || w[0].Key != "allowlist" {
		t.Errorf("starter widenings: %v", w)
	}
	n := 0
	for _, p := range Presets() {
		n += len(p.Entries)
	}
	if len(c.Allowlist) != n {
		t.Errorf("allowlist has %d entries, presets %d", len(c.Allowlist), n)
	}
	// Uncommenting every "# key:" line gives a file that still loads, so
	// the commented examples are valid too.
	leaves := map[string]bool{}
	for _, k := range keyPaths(reflect.TypeOf(File{}), "") {
		for _, part := range strings.Split(k, ".") {
			leaves[part] = true
		}
	}
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if s, ok := strings.CutPrefix(line, "# "); ok {
			if key, _, ok := strings.Cut(strings.TrimSpace(s), ":"); ok && leaves[key] {
				line = s
			}
		}
		b.WriteString(line + "\n")
	}
	if _, err := Parse(strings.NewReader(b.String()), "uncommented"); err != nil {
		t.Errorf("uncommented starter: %v\n%s", err, b.String())
	}
	docs, err := os.ReadFile("../../docs/abox-yaml.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keyPaths(reflect.TypeOf(File{}), "") {
		leaf := k[strings.LastIndex(k, ".")+1:]
		if !strings.Contains(text, leaf+":") {
			t.Errorf("starter does not show %s", k)
		}
		if !strings.Contains(string(docs), "`"+k+"`") {
			t.Errorf("docs/abox-yaml.md does not document `%s`", k)
		}
	}
	if _, err := Starter("dev", []string{"nope"}); err == nil {
		t.Error("unknown preset accepted")
	}
}

// TestStarterWithRulePresets: the allowlist's presets of rules reach the
// starter as quoted lines that load as the preset's lines, and presets
// naming one host with and without rules are refused together.
func TestStarterWithRulePresets(t *testing.T) {
	text, err := Starter("dev", []string{"github-readonly", "npm-readonly"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(strings.NewReader(text), "abox.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Validate()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ln := range c.Allowlist {
		got = append(got, ln.String())
	}
	gh, _ := allowlist.PresetByName("github-readonly")
	npm, _ := allowlist.PresetByName("npm-readonly")
	if want := append(gh.Lines, npm.Lines...); !reflect.DeepEqual(got, want) {
		t.Errorf("lines:\n got %q\nwant %q", got, want)
	}
	if _, err := Starter("dev", []string{"github", "github-readonly"}); err == nil || !strings.Contains(err.Error(), "github.com is listed with rules") {
		t.Errorf("github with github-readonly: %v", err)
	}
}
