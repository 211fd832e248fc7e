package reqrules

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "/"},
		{"/", "/"},
		{"/repos/acme/app", "/repos/acme/app"},
		// Unreserved characters decode, in either hex case.
		{"/repos/%61cme/%41pp", "/repos/acme/App"},
		{"/%7euser/%7Ex", "/~user/~x"},
		{"/a%2db%5fc%2E", "/a-b_c."},
		// Other escapes keep their meaning, with upper-case hex.
		{"/a%3bb", "/a%3Bb"},
		{"/a%3fb%23c", "/a%3Fb%23c"},
		{"/%c3%a9t%C3%A9", "/%C3%A9t%C3%A9"},
		{"/a%20b", "/a%20b"},
		{"/a%2fb", "/a%2Fb"},
		// Raw bytes a path may not hold are encoded.
		{"/a b", "/a%20b"},
		{"/été", "/%C3%A9t%C3%A9"},
		{"/{x}|y^`z\"<>[]", "/%7Bx%7D%7Cy%5E%60z%22%3C%3E%5B%5D"},
		// Reserved characters a path may hold stay as they are.
		{"/a:b@c!$&'()*+,;=d", "/a:b@c!$&'()*+,;=d"},
		// Case is the path's own: HTTP paths are case-sensitive.
		{"/Repos/ACME", "/Repos/ACME"},
		// Duplicate slashes, then dot segments, encoded ones too.
		{"//repos///acme//app", "/repos/acme/app"},
		{"/repos/./acme/./app", "/repos/acme/app"},
		{"/repos/other/../acme/app", "/repos/acme/app"},
		{"/repos/acme/app/../../other/x", "/repos/other/x"},
		{"/repos/%2e%2e/x", "/x"},
		{"/repos/%2E/x", "/repos/x"},
		{"/repos/.%2e/x", "/x"},
		{"/../../x", "/x"},
		{"/a//../b", "/b"}, // slashes collapse before the dots resolve
		// A trailing slash is kept, and made by a trailing dot segment.
		{"/a/b/", "/a/b/"},
		{"/a/b//", "/a/b/"},
		{"/a/b/.", "/a/b/"},
		{"/a/b/..", "/a/"},
		{"/a/..", "/"},
		{"/.", "/"},
		// Dots that are not whole segments are names.
		{"/a/.b/c..d/..x/x.", "/a/.b/c..d/..x/x."},
		// ;parameters that leave a name are kept.
		{"/a;v=1/b", "/a;v=1/b"},
		// An encoded slash between names stays inside its segment.
		{"/@scope%2fname", "/@scope%2Fname"},
		{"/%25", "/%25"},
		{"/100%25", "/100%25"},
		{"/%25zz", "/%25zz"},
		{"/日本", "/%E6%97%A5%E6%9C%AC"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Normalize(tt.in)
			if err != nil || got != tt.want {
				t.Fatalf("Normalize(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
			again, err := Normalize(got)
			if err != nil || again != got {
				t.Errorf("Normalize(%q) = %q, %v; the canonical form must be its own", got, again, err)
			}
		})
	}
}

func TestNormalizeRefuses(t *testing.T) {
	tests := []struct{ in, why string }{
		{"repos/x", "does not start with /"},
		{"*", "does not start with /"},
		{"/a%", "two hex digits"},
		{"/a%2", "two hex digits"},
		{"/a%zz", "two hex digits"},
		{"/a%u002e", "two hex digits"}, // IIS's %u form
		{"/a%00b", "control character"},
		{"/a%0ab", "control character"},
		{"/a%7F", "control character"},
		{"/a\x00b", "control character"},
		{"/a\tb", "control character"},
		{"/a\rb", "control character"},
		{`/a\b`, "backslash"},
		{"/a%5cb", "backslash"},
		{"/a%5C..%5Cb", "backslash"},
		{"/a?b", "without its query"},
		{"/a#b", "without its query"},
		// Double encoding: a server that decodes twice reads %2e.
		{"/a/%252e%252e/b", "encoded percent-encoding"},
		{"/a/%25%32%65", "encoded percent-encoding"}, // the digits decode first
		{"/%252F", "encoded percent-encoding"},
		// ;parameters over a dot or empty segment (Tomcat, Spring, Jetty).
		{"/repos/acme/app/..;/other/x", "drops ;parameters"},
		{"/repos/acme/app/.;x/y", "drops ;parameters"},
		{"/repos/;x/y", "drops ;parameters"},
		{"/repos/..%3B/y", "drops ;parameters"},
		{"/repos/%2e%2e;x/y", "drops ;parameters"},
		// Dots and spaces that Windows trims.
		{"/a/.../b", "trailing dots and spaces"},
		{"/a/..%20/b", "trailing dots and spaces"},
		{"/a/%20/b", "trailing dots and spaces"},
		{"/a/ . /b", "trailing dots and spaces"},
		// Encoded slashes that a decoding server turns into structure.
		{"/a%2F..%2Fb", "dot segment"},
		{"/repos/acme/x%2F..%2F..%2Fother", "dot segment"},
		{"/a%2F", "encoded slash"},
		{"/%2Fa", "encoded slash"},
		{"/a%2F%2Fb", "encoded slash"},
		{"/a%2F.%2Fb", "dot segment"},
		// Bytes that are not UTF-8: overlong '.' and '/' (old IIS), cut.
		{"/a/%C0%AE%C0%AE/b", "UTF-8"},
		{"/a%C0%AFb", "UTF-8"},
		{"/a%E6%97", "UTF-8"},
		{"/a\xff", "UTF-8"},
		// C1 controls and characters that NFKC turns into structure.
		{"/a%C2%85b", "control character"},
		{"/a/%EF%BC%8E%EF%BC%8E/b", "compatibility"}, // fullwidth ..
		{"/a/．．/b", "compatibility"},
		{"/a%EF%BC%8Fb", "compatibility"}, // fullwidth /
		{"/a%EF%BC%BCb", "compatibility"}, // fullwidth \
		{"/a%E2%80%A5", "compatibility"},  // two dot leader
		{"/a%EF%BC%85%32%46", "compatibility"},
		{"/a%EF%BC%9Bb", "compatibility"}, // fullwidth ;
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Normalize(tt.in)
			if err == nil {
				t.Fatalf("Normalize(%q) = %q, want an error saying %q", tt.in, got, tt.why)
			}
			if !errors.Is(err, ErrNotCanonical) {
				t.Errorf("Normalize(%q) error %v is not ErrNotCanonical", tt.in, err)
			}
			if !strings.Contains(err.Error(), tt.why) {
				t.Errorf("Normalize(%q) error = %q, want it to say %q", tt.in, err, tt.why)
			}
		})
	}
}

func TestNormalizeQuery(t *testing.T) {
	tests := []struct{ in, want, why string }{
		{"", "", ""},
		{"service=git-upload-pack", "service=git-upload-pack", ""},
		{"service=git%2dupload%2Dpack", "service=git-upload-pack", ""},
		{"q=a%2bb+c&x=%e9", "q=a%2Bb+c&x=%E9", ""},
		{"a=1?b=/c", "a=1?b=/c", ""},
		{"q=a b", "q=a%20b", ""},
		{"q=%", "", "two hex digits"},
		{"q=a\nb", "", "control character"},
		{"q=a#b", "", "fragment"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := NormalizeQuery(tt.in)
			if tt.why != "" {
				if err == nil || !strings.Contains(err.Error(), tt.why) || !errors.Is(err, ErrNotCanonical) {
					t.Fatalf("NormalizeQuery(%q) = %q, %v; want an error saying %q", tt.in, got, err, tt.why)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("NormalizeQuery(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

// cleanOracle resolves an escaped path independently of Normalize: each
// segment decoded by net/url (an encoded slash kept apart as NUL, which
// neither form holds otherwise), then path.Clean, with RFC 3986's trailing
// slash after a last "", "." or "..". ok is false when net/url cannot
// decode a segment.
func cleanOracle(escaped string) (string, bool) {
	raw := strings.Split(strings.TrimPrefix(escaped, "/"), "/")
	dec := make([]string, len(raw))
	for i, s := range raw {
		d, err := url.PathUnescape(strings.ReplaceAll(strings.ReplaceAll(s, "%2F", "\x00"), "%2f", "\x00"))
		if err != nil {
			return "", false
		}
		dec[i] = d
	}
	out := path.Clean("/" + strings.Join(dec, "/"))
	last := dec[len(dec)-1]
	if out != "/" && (last == "" || last == "." || last == "..") {
		out += "/"
	}
	return out, true
}

func TestOracleAgreesOnTable(t *testing.T) {
	for _, in := range []string{"/a/b/../c", "//a//b/", "/a/%2e%2E/b", "/a/b/.", "/x/%2e", "/@s%2fn/x", "/a/b/c/../../.."} {
		c, err := Normalize(in)
		if err != nil {
			t.Fatalf("Normalize(%q): %v", in, err)
		}
		want, _ := cleanOracle(in)
		got, _ := cleanOracle(c)
		if got != want {
			t.Errorf("%q: the canonical %q reads as %q, the input as %q", in, c, got, want)
		}
	}
}

// The proxy sends Target.Path upstream through Target.SetURL; a real
// origin behind net/http must receive those bytes, and a server that
// decodes (Go's r.URL.Path) the path the rule saw decoded.
func TestSetURLSendsTheDecidedForm(t *testing.T) {
	got := make(chan [3]string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- [3]string{r.RequestURI, r.URL.EscapedPath(), r.URL.Path}
	}))
	defer srv.Close()
	set := NewSet("origin.test", []Rule{MustParseRule("GET /**"), MustParseRule("GET /q?a=1")})
	for _, in := range []struct{ path, query string }{
		{"/repos/%61cme/./x/../app", ""},
		{"/@scope%2fname", ""},
		{"//a;v=1//b%3b/%c3%a9/", "z=%7e&a=%41"},
		{"/a%20b/{c}", "q=a%2fb"},
		{"/q", "a=%31"},
	} {
		t.Run(in.path, func(t *testing.T) {
			d, tg := set.Check(http.MethodGet, in.path, in.query)
			if !d.Allowed {
				t.Fatalf("Check refused %q: %+v", in.path, d)
			}
			u, err := url.Parse(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			tg.SetURL(u)
			if u.EscapedPath() != tg.Path {
				t.Fatalf("SetURL: EscapedPath %q, want the decided %q", u.EscapedPath(), tg.Path)
			}
			resp, err := srv.Client().Get(u.String())
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			o := <-got
			wantURI := tg.Path
			if tg.Query != "" {
				wantURI += "?" + tg.Query
			}
			if o[0] != wantURI || o[1] != tg.Path {
				t.Errorf("the origin read %q (path %q), the rule decided %q", o[0], o[1], wantURI)
			}
			if o[2] != PercentDecode(tg.Path) {
				t.Errorf("the origin decoded %q, the rule's path decodes to %q", o[2], PercentDecode(tg.Path))
			}
		})
	}
}

// TestCanonicalFastPath: the paths Normalize returns unchanged without
// the long way are exactly those the long way returns unchanged too, for
// every path of a small alphabet up to six bytes.
func TestCanonicalFastPath(t *testing.T) {
	alpha := []byte{'/', 'a', '.', ';', '%', '2', 'F', 'e', ' ', '*', '\\'}
	var walk func(prefix []byte)
	n := 0
	walk = func(prefix []byte) {
		if len(prefix) > 0 {
			p := string(prefix)
			n++
			if canonicalASCII(p) {
				if c, err := normalize(p); err != nil || c != p {
					t.Fatalf("fast path takes %q, the long way gives %q, %v", p, c, err)
				}
			}
		}
		if len(prefix) == 6 {
			return
		}
		for _, c := range alpha {
			walk(append(prefix, c))
		}
	}
	walk([]byte{'/'})
	for _, p := range []string{"/", "/a/", "/a;v=1/b", "/a/b/c", "/.a", "/a.", "/a..b", "/~x", "/a:b@c", "/;x", "/..;x", "/.../a", "/a//b"} {
		c, err := normalize(p)
		if fast := canonicalASCII(p); fast != (err == nil && c == p) {
			t.Errorf("%q: fast path %v, long way %q %v", p, fast, c, err)
		}
	}
	if n < 1000 {
		t.Fatalf("only %d paths tried", n)
	}
}
