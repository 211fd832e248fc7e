package allowlist

import (
	"slices"
	"strings"
)

// Preset is a named block of allowlist lines for a common case. Presets
// are text to read and cut down, copied into an allowlist as they are;
// the list never refers to one by name, so a preset that changes in a
// later abox changes no list, and trust covers the lines themselves.
type Preset struct {
	Name string
	// About says what the lines allow and what they leave out.
	About string
	// Lines are allowlist lines (ParseLine), comments allowed.
	Lines []string
}

// Text renders the preset as an allowlist fragment with its About as
// comments.
func (p Preset) Text() string {
	var b strings.Builder
	b.WriteString("# preset " + p.Name + ": ")
	b.WriteString(strings.ReplaceAll(p.About, "\n", "\n# "))
	b.WriteByte('\n')
	for _, l := range p.Lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// presets is the table. Each rule's reason is in docs/policy.md.
var presets = []Preset{
	{
		Name: "github-readonly",
		About: "clone and fetch over HTTPS, API reads, raw files, archives and release downloads;\n" +
			"no push (git-receive-pack, also its discovery), no API writes, no GraphQL (its queries and mutations are both POSTs)",
		Lines: []string{
			"github.com GET /*/*/info/refs?service=git-upload-pack",
			"github.com POST /*/*/git-upload-pack",
			"github.com GET,HEAD /*/*/archive/**",
			"github.com GET,HEAD /*/*/releases/download/**",
			"api.github.com GET,HEAD /**",
			"codeload.github.com GET,HEAD /**",
			"raw.githubusercontent.com GET,HEAD /**",
			"objects.githubusercontent.com GET,HEAD /**",
			"release-assets.githubusercontent.com GET,HEAD /**",
		},
	},
	{
		Name:  "npm-readonly",
		About: "npm install from the public registry; no publish, unpublish, login or audit (npm install warns that audit failed)",
		Lines: []string{
			"registry.npmjs.org GET,HEAD /**",
		},
	},
	{
		Name:  "pypi-readonly",
		About: "pip install from PyPI (the simple index, the JSON API, the files); uploads go to upload.pypi.org, which is not listed",
		Lines: []string{
			"pypi.org GET,HEAD /simple/**",
			"pypi.org GET,HEAD /pypi/**",
			"files.pythonhosted.org GET,HEAD /packages/**",
		},
	},
	{
		Name:  "goproxy-readonly",
		About: "go mod download through the public module proxy and checksum database",
		Lines: []string{
			"proxy.golang.org GET,HEAD /**",
			"sum.golang.org GET,HEAD /**",
		},
	},
	{
		Name:  "anthropic-api",
		About: "the Messages API (and its token counting and batches); no Files API, no admin API",
		Lines: []string{
			"api.anthropic.com POST /v1/messages/**",
			"api.anthropic.com GET /v1/messages/batches/**",
		},
	},
	{
		Name:  "openai-api",
		About: "the Responses and Chat Completions APIs; no Files, fine-tuning or vector-store uploads",
		Lines: []string{
			"api.openai.com POST /v1/responses",
			"api.openai.com GET /v1/responses/*",
			"api.openai.com POST /v1/chat/completions",
		},
	},
}

// Presets returns the presets, by name.
func Presets() []Preset {
	out := slices.Clone(presets)
	for i := range out {
		out[i].Lines = slices.Clone(out[i].Lines)
	}
	return out
}

// PresetByName returns the preset called name.
func PresetByName(name string) (Preset, bool) {
	for _, p := range Presets() {
		if p.Name == name {
			return p, true
		}
	}
	return Preset{}, false
}
