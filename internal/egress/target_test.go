package egress

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestParseAuthority(t *testing.T) {
	tests := []struct {
		name, in string
		def      uint16
		wantName string
		wantAddr string
		wantPort uint16
		wantErr  bool
	}{
		{name: "name", in: "example.com", def: 80, wantName: "example.com", wantPort: 80},
		{name: "name with port", in: "Example.COM:8443", def: 80, wantName: "example.com", wantPort: 8443},
		{name: "trailing dot", in: "example.com.:443", wantName: "example.com", wantPort: 443},
		{name: "two trailing dots", in: "example.com..:443", wantErr: true},
		{name: "idna", in: "bücher.example:443", wantName: "xn--bcher-kva.example", wantPort: 443},
		{name: "dotted quad", in: "127.0.0.1:80", wantAddr: "127.0.0.1", wantPort: 80},
		{name: "dotted quad trailing dot", in: "127.0.0.1.:80", wantAddr: "127.0.0.1", wantPort: 80},
		{name: "decimal", in: "2130706433:80", wantErr: true},
		{name: "decimal trailing dot", in: "2130706433.:80", wantErr: true},
		{name: "octal", in: "0177.0.0.1:80", wantErr: true},
		{name: "octal whole", in: "017700000001:80", wantErr: true},
		{name: "hex short", in: "0x7f.1:80", wantErr: true},
		{name: "hex whole", in: "0x7F000001:80", wantErr: true},
		{name: "hex dotted", in: "0xa9.0xfe.0xa9.0xfe:80", wantErr: true},
		{name: "short form", in: "127.1:80", wantErr: true},
		{name: "three parts", in: "10.1.258:80", wantErr: true},
		{name: "mixed bases", in: "0x7f.0.01.1:80", wantErr: true},
		{name: "zero", in: "0:80", wantErr: true},
		{name: "bare 0x", in: "0x:80", wantErr: true},
		{name: "percent encoded dots", in: "127%2E0%2e0%2E1:80", wantAddr: "127.0.0.1", wantPort: 80},
		{name: "percent encoded name", in: "ex%61mple.com:80", wantName: "example.com", wantPort: 80},
		{name: "double percent encoding", in: "127%252E0%252E0%252E1:80", wantErr: true},
		{name: "bad percent", in: "ex%6:80", wantErr: true},
		{name: "fullwidth digits", in: "１２７.０.０.１:80", wantAddr: "127.0.0.1", wantPort: 80},
		{name: "ideographic dots", in: "127。0。0。1:80", wantAddr: "127.0.0.1", wantPort: 80},
		{name: "bracketed v6", in: "[::1]:443", wantAddr: "::1", wantPort: 443},
		{name: "bracketed v6 default port", in: "[2001:db8::1]", def: 443, wantAddr: "2001:db8::1", wantPort: 443},
		{name: "mapped v4", in: "[::ffff:127.0.0.1]:80", wantAddr: "127.0.0.1", wantPort: 80},
		{name: "mapped v4 hex", in: "[::ffff:7f00:1]:80", wantAddr: "127.0.0.1", wantPort: 80},
		{name: "zone rfc6874", in: "[fe80::1%25eth0]:80", wantAddr: "fe80::1", wantPort: 80},
		{name: "zone bare", in: "[fe80::1%eth0]:80", wantAddr: "fe80::1", wantPort: 80},
		{name: "unbracketed v6", in: "::1:443", wantErr: true},
		{name: "v4 in brackets", in: "[127.0.0.1]:80", wantErr: true},
		{name: "octal v4 inside v6", in: "[::ffff:0177.0.0.1]:80", wantErr: true},
		{name: "userinfo", in: "allowed.com@127.0.0.1:80", wantErr: true},
		{name: "userinfo with colon", in: "a:b@127.0.0.1:80", wantErr: true},
		{name: "path", in: "example.com/x:80", wantErr: true},
		{name: "backslash", in: "example.com\\@evil:80", wantErr: true},
		{name: "space", in: "example .com:80", wantErr: true},
		{name: "missing port required", in: "example.com", wantErr: true},
		{name: "empty port", in: "example.com:", def: 80, wantErr: true},
		{name: "port zero", in: "example.com:0", wantErr: true},
		{name: "port too big", in: "example.com:65536", wantErr: true},
		{name: "port signed", in: "example.com:+80", wantErr: true},
		{name: "empty", in: "", def: 80, wantErr: true},
		{name: "numeric too large", in: "4294967296:80", wantErr: true},
		{name: "part too large", in: "256.0.0.1:80", wantErr: true},
		{name: "bad octal", in: "08.0.0.1:80", wantErr: true},
		{name: "five parts", in: "1.2.3.4.5:80", wantErr: true},
		{name: "empty part", in: "1..1:80", wantErr: true},
		{name: "ends in number", in: "example.0x7f:80", wantErr: true},
		{name: "name with numeric middle", in: "1.2.3.example:80", wantName: "1.2.3.example", wantPort: 80},
		{name: "hex looking name", in: "7f000001:80", wantName: "7f000001", wantPort: 80},
		{name: "garbage after bracket", in: "[::1]x:80", wantErr: true},
		{name: "unterminated bracket", in: "[::1:80", wantErr: true},
		{name: "healthcheck", in: "healthcheck.abox.local:443", wantName: "healthcheck.abox.local", wantPort: 443},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAuthority(tt.in, tt.def)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ParseAuthority(%q) = %+v, want error", tt.in, got)
				}
				if !errors.Is(err, ErrInvalidTarget) {
					t.Errorf("error %v does not wrap ErrInvalidTarget", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseAuthority(%q): %v", tt.in, err)
			}
			if got.Name != tt.wantName {
				t.Errorf("Name = %q, want %q", got.Name, tt.wantName)
			}
			var want netip.Addr
			if tt.wantAddr != "" {
				want = netip.MustParseAddr(tt.wantAddr)
			}
			if got.Addr != want {
				t.Errorf("Addr = %v, want %v", got.Addr, want)
			}
			if got.Port != tt.wantPort {
				t.Errorf("Port = %d, want %d", got.Port, tt.wantPort)
			}
		})
	}
}

// FuzzParseTarget checks the parser's invariants: it never panics; a name
// result is never numeric (it would reach the resolver); results re-parse to
// themselves.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"example.com:443", "[::1]:80", "0x7f.1:80", "2130706433", "127%2E0.0.1:80",
		"[fe80::1%25eth0]:80", "a@b:80", "１２７.０.０.１", "0177.0.0.1.", "[::ffff:1.2.3.4]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseAuthority(s, 80)
		if err != nil {
			return
		}
		if got.IsIP() == (got.Name != "") {
			t.Fatalf("%q: exactly one of Name and Addr must be set: %+v", s, got)
		}
		if got.Name != "" {
			last := got.Name[strings.LastIndexByte(got.Name, '.')+1:]
			if isNumber(last) {
				t.Fatalf("%q: numeric name %q would be resolved", s, got.Name)
			}
		}
		if got.Addr.Zone() != "" || got.Addr.Is4In6() {
			t.Fatalf("%q: address %v keeps a zone or a mapping", s, got.Addr)
		}
		again, err := ParseAuthority(got.Authority(), 0)
		if err != nil || !again.Same(got) {
			t.Fatalf("%q: %q re-parses to %+v, %v", s, got.Authority(), again, err)
		}
	})
}
