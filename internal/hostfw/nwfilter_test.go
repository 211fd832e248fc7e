package hostfw

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// listings plays ebtables -t nat -L and iptables/ip6tables -t filter -S
// with the given outputs.
type listings struct {
	eb, v4, v6 string
	cmds       []string
}

func (l *listings) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	cmd := name + " " + strings.Join(args, " ")
	l.cmds = append(l.cmds, cmd)
	switch cmd {
	case "ebtables -t nat -L":
		return []byte(l.eb), nil
	case "iptables -w 10 -t filter -S":
		return []byte(l.v4), nil
	case "ip6tables -w 10 -t filter -S":
		return []byte(l.v6), nil
	}
	return nil, exitErr(2)
}

func (l *listings) RunInput(ctx context.Context, _ []byte, name string, args ...string) ([]byte, error) {
	return l.Run(ctx, name, args...)
}

// realListings are what the tools printed with abox's filter bound to
// vnwf1 and vnwf10 by libvirt 9.0 (recorded by TestE2ENWFilterRulesChecked
// with -update).
func realListings(t *testing.T) *listings {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	return &listings{eb: read("nwfilter-ebtables.txt"), v4: read("nwfilter-iptables.txt"), v6: read("nwfilter-ip6tables.txt")}
}

// dropLines removes the lines of s that match re.
func dropLines(s, re string) string {
	rx := regexp.MustCompile(re)
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !rx.MatchString(l) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func TestCheckNWFilter(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		edit   func(l *listings)
		tap    string
		want   []string // problems, each a prefix of one reported, in order
		intact bool
	}{
		{name: "bound", tap: "vnwf1", intact: true},
		{name: "bound, the longer name", tap: "vnwf10", intact: true},
		{name: "never bound", tap: "vnwf2", want: []string{
			"ebtables: nat PREROUTING jump to libvirt-I-vnwf2 missing", "ebtables: nat chain libvirt-I-vnwf2 missing",
			"ebtables: nat POSTROUTING jump to libvirt-O-vnwf2 missing", "ebtables: nat chain libvirt-O-vnwf2 missing",
			"iptables: filter libvirt-in jump for vnwf2 to FI-vnwf2 missing", "iptables: filter chain FI-vnwf2 missing",
			"iptables: filter libvirt-out jump for vnwf2 to FO-vnwf2 missing", "iptables: filter chain FO-vnwf2 missing",
			"iptables: filter libvirt-host-in jump for vnwf2 to HI-vnwf2 missing", "iptables: filter chain HI-vnwf2 missing",
			"ip6tables: filter libvirt-in jump for vnwf2 to FI-vnwf2 missing", "ip6tables: filter chain FI-vnwf2 missing",
			"ip6tables: filter libvirt-out jump for vnwf2 to FO-vnwf2 missing", "ip6tables: filter chain FO-vnwf2 missing",
			"ip6tables: filter libvirt-host-in jump for vnwf2 to HI-vnwf2 missing", "ip6tables: filter chain HI-vnwf2 missing",
		}},
		{name: "the shorter name's rules gone, the longer's kept", tap: "vnwf1", edit: func(l *listings) {
			l.eb = dropLines(l.eb, `vnwf1\b`)
			l.v4 = dropLines(l.v4, `vnwf1\b`)
		}, want: []string{
			"ebtables: nat PREROUTING jump to libvirt-I-vnwf1 missing", "ebtables: nat chain libvirt-I-vnwf1 missing",
			"ebtables: nat POSTROUTING jump to libvirt-O-vnwf1 missing", "ebtables: nat chain libvirt-O-vnwf1 missing",
			"iptables: filter libvirt-in jump for vnwf1 to FI-vnwf1 missing", "iptables: filter chain FI-vnwf1 missing",
			"iptables: filter libvirt-out jump for vnwf1 to FO-vnwf1 missing", "iptables: filter chain FO-vnwf1 missing",
			"iptables: filter libvirt-host-in jump for vnwf1 to HI-vnwf1 missing", "iptables: filter chain HI-vnwf1 missing",
		}},
		{name: "ebtables -t nat -F", tap: "vnwf10", edit: func(l *listings) { l.eb = dropLines(l.eb, `^-`) }, want: []string{
			"ebtables: nat PREROUTING jump to libvirt-I-vnwf10 missing", "ebtables: nat chain libvirt-I-vnwf10 is empty",
			"ebtables: nat POSTROUTING jump to libvirt-O-vnwf10 missing", "ebtables: nat chain libvirt-O-vnwf10 is empty",
		}},
		{name: "iptables -F", tap: "vnwf1", edit: func(l *listings) { l.v4 = dropLines(l.v4, `^-A `) }, want: []string{
			"iptables: filter FORWARD jump to libvirt-in missing", "iptables: filter libvirt-in jump for vnwf1 to FI-vnwf1 missing", "iptables: filter chain FI-vnwf1 is empty",
			"iptables: filter FORWARD jump to libvirt-out missing", "iptables: filter libvirt-out jump for vnwf1 to FO-vnwf1 missing", "iptables: filter chain FO-vnwf1 is empty",
			"iptables: filter INPUT jump to libvirt-host-in missing", "iptables: filter libvirt-host-in jump for vnwf1 to HI-vnwf1 missing", "iptables: filter chain HI-vnwf1 is empty",
		}},
		{name: "ip6tables -F -X", tap: "vnwf1", edit: func(l *listings) { l.v6 = dropLines(l.v6, `^-[AN] `) }, want: []string{
			"ip6tables: filter FORWARD jump to libvirt-in missing", "ip6tables: filter libvirt-in jump for vnwf1 to FI-vnwf1 missing", "ip6tables: filter chain FI-vnwf1 missing",
			"ip6tables: filter FORWARD jump to libvirt-out missing", "ip6tables: filter libvirt-out jump for vnwf1 to FO-vnwf1 missing", "ip6tables: filter chain FO-vnwf1 missing",
			"ip6tables: filter INPUT jump to libvirt-host-in missing", "ip6tables: filter libvirt-host-in jump for vnwf1 to HI-vnwf1 missing", "ip6tables: filter chain HI-vnwf1 missing",
		}},
		{name: "final drops deleted", tap: "vnwf1", edit: func(l *listings) {
			l.v4 = dropLines(l.v4, `^-A HI-vnwf1 -j DROP$`)
			l.eb = strings.Replace(l.eb, "--arp-ip-dst 10.99.8.10 -j ACCEPT\n-j DROP\n", "--arp-ip-dst 10.99.8.10 -j ACCEPT\n", 1)
		}, want: []string{
			`ebtables: nat chain libvirt-O-vnwf1 does not end in DROP (last rule "-p ARP --arp-ip-dst 10.99.8.10 -j ACCEPT")`,
			`iptables: filter chain HI-vnwf1 does not end in DROP (last rule "-d 10.99.8.1/32 -p tcp -m tcp --dport 53 -m conntrack --ctstate NEW -j RETURN")`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := realListings(t)
			if tt.edit != nil {
				tt.edit(l)
			}
			st, err := New(l).CheckNWFilter(ctx, tt.tap)
			if err != nil {
				t.Fatal(err)
			}
			if st.Intact() != tt.intact {
				t.Fatalf("Intact = %v, want %v: %q", st.Intact(), tt.intact, st.Problems)
			}
			if len(st.Problems) != len(tt.want) {
				t.Fatalf("problems:\n%s\nwant %d:\n%s", strings.Join(st.Problems, "\n"), len(tt.want), strings.Join(tt.want, "\n"))
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(st.Problems[i], w) {
					t.Errorf("problem %d = %q, want %q", i, st.Problems[i], w)
				}
			}
		})
	}
	t.Run("bad tap name", func(t *testing.T) {
		l := realListings(t)
		if _, err := New(l).CheckNWFilter(ctx, "-j ACCEPT"); err == nil || len(l.cmds) != 0 {
			t.Errorf("CheckNWFilter of a bad name = %v after %q, want an error before any command", err, l.cmds)
		}
	})
	t.Run("listing fails", func(t *testing.T) {
		l := realListings(t)
		fw := New(l)
		fw.tools = []string{"iptables", "arptables"}
		if _, err := fw.CheckNWFilter(ctx, "vnwf1"); err == nil {
			t.Error("CheckNWFilter succeeded although a listing failed")
		}
	})
}
