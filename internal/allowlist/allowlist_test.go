package allowlist

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func mustParse(t *testing.T, text string) *List {
	t.Helper()
	l, err := Parse(strings.NewReader(text), "test")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return l
}

func TestMatch(t *testing.T) {
	l := mustParse(t, `
# comment
example.com
*.example.org   # inline comment
API.GitHub.com.
*.deep.example.net
bücher.example
`)
	tests := []struct {
		name     string
		verdict  Verdict
		wantRule string
	}{
		{"example.com", Allow, "example.com"},
		{"EXAMPLE.COM", Allow, "example.com"},
		{"example.com.", Allow, "example.com"},
		{"www.example.com", Block, ""}, // exact entry does not cover subdomains
		{"example.org", Block, ""},     // wildcard does not cover the apex
		{"a.example.org", Allow, "*.example.org"},
		{"a.b.c.example.org", Allow, "*.example.org"}, // any depth
		{"evil-example.com", Block, ""},
		{"example.com.evil.test", Block, ""},
		{"notexample.org", Block, ""},
		{"xexample.org", Block, ""},
		{"api.github.com", Allow, "api.github.com"},
		{"github.com", Block, ""},
		{"deep.example.net", Block, ""},
		{"x.deep.example.net", Allow, "*.deep.example.net"},
		{"xn--bcher-kva.example", Allow, "xn--bcher-kva.example"},
		{"BÜCHER.example", Allow, "xn--bcher-kva.example"},
		{"", Block, ""},
		{"exa mple.com", Block, ""},
		{`example\.com`, Block, ""},
		{"example..com", Block, ""},
		{".example.com", Block, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := l.Match(tt.name)
			if d.Verdict != tt.verdict || d.Rule != tt.wantRule {
				t.Errorf("Match(%q) = %+v, want verdict %s rule %q", tt.name, d, tt.verdict, tt.wantRule)
			}
			if d.Verdict == Block && d.Reason == ReasonAllowlisted {
				t.Errorf("blocked with reason %q", d.Reason)
			}
		})
	}
}

func TestParseEntryRejects(t *testing.T) {
	tests := []struct{ entry, wantErr string }{
		{"*", "allow everything"},
		{"*.", "allow everything"},
		{"com", "top-level"},
		{"*.com", "top-level"},
		{"*.co.uk", "public suffix"},
		{"*.github.io", "public suffix"}, // private-section public suffix: unrelated owners too
		// Wildcard rules (*.kawasaki.jp, *.compute.amazonaws.com) make every
		// child a public suffix: the wildcard spans unrelated owners.
		{"*.kawasaki.jp", "public suffixes"},
		{"*.compute.amazonaws.com", "public suffixes"},
		{"*.Compute.AmazonAWS.com.", "public suffixes"},
		// A public suffix deeper below the name (PSL private section): the
		// wildcard would match anyone's bucket, storage account or service.
		{"*.amazonaws.com", "public suffix below amazonaws.com"},
		{"*.s3.amazonaws.com", "public suffix"},
		{"*.core.windows.net", "is a public suffix below core.windows.net"},
		{"*.windows.net", "public suffix below windows.net"},
		{"*.fastly.net", "map.fastly.net is a public suffix below fastly.net"},
		{"*.ssl.fastly.net", "a.ssl.fastly.net is a public suffix below ssl.fastly.net"},
		{"*.amazonaws.com", "such as *.NAME."},
		{"foo.*.example.com", "whole first label"},
		{"*example.com", "whole first label"},
		{"**.example.com", "whole first label"},
		{"127.0.0.1", "IP addresses"},
		{"10.1.2.3", "IP addresses"},
		{"::1", "host name only"},
		{"[::1]", "host name only"},
		{"127.1", "IP addresses"},
		{"0x7f.1", "IP addresses"},
		{"2130706433", "IP addresses"},
		{"http://example.com", "host name only"},
		{"example.com/path", "host name only"},
		{"example.com:443", "host name only"},
		{"user@example.com", "host name only"},
		{"exa mple.com", "without spaces"},
		{"-bad.example.com", "hyphen"},
		{strings.Repeat("a", 64) + ".com", "63 bytes"},
		{strings.Repeat("a.", 127) + "com", "253 bytes"},
		{"ex!ample.com", "not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.entry, func(t *testing.T) {
			_, err := ParseEntry(tt.entry)
			if err == nil {
				t.Fatalf("ParseEntry(%q) accepted, want error containing %q", tt.entry, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseEntry(%q) error = %q, want it to contain %q", tt.entry, err, tt.wantErr)
			}
		})
	}
}

func TestParseEntryAccepts(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Example.COM.", "example.com"},
		{"*.Example.com", "*.example.com"},
		{"*.example.co.uk", "*.example.co.uk"},
		{"*.city.kawasaki.jp", "*.city.kawasaki.jp"}, // PSL exception: a registrable domain
		{"*.foo.city.kawasaki.jp", "*.foo.city.kawasaki.jp"},
		{"user.github.io", "user.github.io"},
		{"_sip._tcp.example.com", "_sip._tcp.example.com"},
		{"münchen.de", "xn--mnchen-3ya.de"},
		{"1password.com", "1password.com"},
		{"cafe.de", "cafe.de"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			e, err := ParseEntry(tt.in)
			if err != nil {
				t.Fatalf("ParseEntry(%q): %v", tt.in, err)
			}
			if got := e.String(); got != tt.want {
				t.Errorf("ParseEntry(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseRejectsWholeFileWithLines(t *testing.T) {
	_, err := Parse(strings.NewReader("good.example.com\n*\n\n# ok\n*.com\nfine.example.org\n"), "/etc/list")
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("Parse error = %v, want *ParseError", err)
	}
	if len(pe.Lines) != 2 {
		t.Fatalf("got %d line errors, want 2: %v", len(pe.Lines), err)
	}
	if pe.Lines[0].Line != 2 || pe.Lines[1].Line != 5 {
		t.Errorf("line numbers = %d, %d, want 2, 5", pe.Lines[0].Line, pe.Lines[1].Line)
	}
	if !strings.Contains(err.Error(), "/etc/list:2:") || !strings.Contains(err.Error(), "/etc/list:5:") {
		t.Errorf("error %q does not name file:line", err)
	}
}

func TestParseLongLine(t *testing.T) {
	_, err := Parse(strings.NewReader("ok.example.com\n"+strings.Repeat("a", 10000)+"\n"), "f")
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("Parse of an oversized line: err = %v, want a line-length error", err)
	}
}

func TestDuplicatesAndEntries(t *testing.T) {
	l := mustParse(t, "a.example.com\nA.example.com.\n*.example.com\n*.EXAMPLE.com\n")
	if l.Len() != 2 {
		t.Fatalf("Len = %d, want 2", l.Len())
	}
	got := Format(l.Entries())
	if got != "*.example.com\na.example.com\n" {
		t.Errorf("Format = %q", got)
	}
	if !l.Contains(Entry{Name: "example.com", Wildcard: true}) || l.Contains(Entry{Name: "example.com"}) {
		t.Errorf("Contains is wrong for wildcard vs apex")
	}
}

func TestNilAndEmptyListBlock(t *testing.T) {
	var l *List
	if d := l.Match("example.com"); d.Verdict != Block {
		t.Errorf("nil list allowed %+v", d)
	}
	if d := mustParse(t, "").Match("example.com"); d.Verdict != Block {
		t.Errorf("empty list allowed %+v", d)
	}
}

func FuzzNormalizeName(f *testing.F) {
	for _, s := range []string{"example.com", "EXAMPLE.com.", "bücher.de", "a..b", "*.x", "xn--bcher-kva.de", "\x00", "a\\.b",
		"_dmarc.example.com", "-a.com", strings.Repeat("a.", 130), "ＥＸＡＭＰＬＥ.com", "exa\x00mple.com"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := NormalizeName(s)
		if err != nil {
			return
		}
		if len(n) > 253 || n == "" {
			t.Fatalf("NormalizeName(%q) = %q: bad length", s, n)
		}
		for i := 0; i < len(n); i++ {
			c := n[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
				t.Fatalf("NormalizeName(%q) = %q: byte %q", s, n, c)
			}
		}
		if strings.HasSuffix(n, ".") || strings.Contains(n, "..") || strings.HasPrefix(n, ".") {
			t.Fatalf("NormalizeName(%q) = %q: empty label or trailing dot", s, n)
		}
		n2, err := NormalizeName(n)
		if err != nil || n2 != n {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", s, n, n2, err)
		}
		// A name that normalises must match an exact entry of itself, and
		// never a list that does not contain it or a parent wildcard.
		l := New([]Entry{{Name: n}})
		if d := l.Match(s); d.Verdict != Allow {
			t.Fatalf("exact list for %q does not allow %q", n, s)
		}
		if d := New([]Entry{{Name: "x" + n}}).Match(s); d.Verdict != Block {
			t.Fatalf("list x%s allows %q", n, s)
		}
	})
}

func benchList(n int) (*List, []string) {
	entries := make([]Entry, 0, n)
	for i := 0; i < n; i++ {
		if i%2 == 0 {
			entries = append(entries, Entry{Name: fmt.Sprintf("host%d.example%d.com", i, i%997)})
		} else {
			entries = append(entries, Entry{Name: fmt.Sprintf("example%d.net", i), Wildcard: true})
		}
	}
	queries := []string{
		"host0.example0.com",                     // exact hit
		"a.b.c.example1.net",                     // wildcard hit
		"www.nowhere-at-all.org",                 // miss
		"deep.sub.domain.of.something.miss.test", // deep miss
	}
	return New(entries), queries
}

func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			l, qs := benchList(n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				l.Match(qs[i%len(qs)])
			}
		})
	}
}

// BenchmarkBuild reports the memory a list of n entries takes (B/op of one build).
func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			var sb strings.Builder
			for i := 0; i < n; i++ {
				if i%2 == 0 {
					fmt.Fprintf(&sb, "host%d.example%d.com\n", i, i%997)
				} else {
					fmt.Fprintf(&sb, "*.sub%d.example.net\n", i)
				}
			}
			text := sb.String()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(strings.NewReader(text), "bench"); err != nil {
					b.Fatal(err)
				}
			}
			// Retained heap of one live list: what a filter keeps in memory.
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			l, _ := Parse(strings.NewReader(text), "bench")
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "retained-MiB")
			runtime.KeepAlive(l)
		})
	}
}

// TestSpecialUseTables: every zone refused names its source, and the
// special-use names forwarded on purpose are not refused (the two tables
// do not overlap).
func TestSpecialUseTables(t *testing.T) {
	for _, e := range specialUse {
		if e.source == "" || !SpecialUse(e.zone) || !SpecialUse("a."+e.zone) {
			t.Errorf("special-use zone %q (source %q)", e.zone, e.source)
		}
	}
	for _, e := range specialUseForwarded {
		if e.why == "" || SpecialUse("a."+e.zone) {
			t.Errorf("%q is listed as forwarded (%q) but refused", e.zone, e.why)
		}
	}
}
