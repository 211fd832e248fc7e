package hostfw

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

// TestAnswerTable pins the answer table's text for the test bridge: what
// it answers, how, at which rate, and that it passes everything else on.
func TestAnswerTable(t *testing.T) {
	golden(t, "answer-table.nft", answerTable(bb))
	got := answerTable(bb)
	// Spelled out here too, so that a change to the security-relevant
	// parts shows up in this test and not only in a regenerated file.
	for _, want := range []string{
		// After conntrack, before mangle's DROPs.
		"type filter hook prerouting priority -175; policy accept;",
		// Only the guest, from its own address, to the host's unicast
		// address: an answer never goes anywhere but back to the guest.
		"iifname != \"" + br + "\" return",
		"ip saddr != 10.10.7.10 return",
		"meta pkttype != host return",
		"ct state != new return",
		// The gateway's services are never answered.
		"ip daddr 10.10.7.1 udp dport 53 return",
		"ip daddr 10.10.7.1 tcp dport { 53, 3128 } return",
		"limit rate over 50/second burst 100 packets drop",
		"reject with tcp reset",
		"reject with icmp admin-prohibited",
	} {
		if !strings.Contains(got, "\t\t"+want+"\n") {
			t.Errorf("answer table lacks %q:\n%s", want, got)
		}
	}
	// Every rule but the answers themselves and the limit's drop ends
	// in return: the table never accepts, so without it (or past it)
	// the chains judge the packet as before.
	for _, l := range strings.Split(got, "\n") {
		l = strings.TrimSpace(l)
		if strings.Contains(l, "accept") && !strings.HasPrefix(l, "type filter") {
			t.Errorf("answer table accepts: %q", l)
		}
	}
	// The limit comes before the answers, and the source checks before
	// either.
	order := []string{"ip saddr != ", "ct state != new", "limit rate over", "reject with tcp reset"}
	last := -1
	for _, o := range order {
		i := strings.Index(got, o)
		if i < last {
			t.Errorf("%q comes before an earlier check in:\n%s", o, got)
		}
		last = i
	}
}

func TestAnswerTableFollowsBridge(t *testing.T) {
	b := Bridge{Name: "abx-other", Gateway: netip.MustParseAddr("10.20.0.1"), ProxyPort: 28128, Guest: netip.MustParseAddr("10.20.0.10")}
	got := answerTable(b)
	for _, want := range []string{"table ip abox-abx-other {", `iifname != "abx-other"`, "ip saddr != 10.20.0.10 ", "ip daddr 10.20.0.1 tcp dport { 53, 28128 }"} {
		if !strings.Contains(got, want) {
			t.Errorf("answer table for %+v lacks %q:\n%s", b, want, got)
		}
	}
}

func TestAnswerTableEnsuredCheckedRemoved(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	name := AnswerTableName(br)
	if got := tables.nft[name]; got != answerTable(bb) {
		t.Fatalf("after Ensure the table holds %q, want %q", got, answerTable(bb))
	}
	tests := []struct {
		name   string
		tamper func()
		want   string
	}{
		{"deleted", func() { delete(tables.nft, name) }, "nft: table ip " + name + " missing"},
		{"reject rule gone", func() {
			tables.nft[name] = strings.Replace(answerTable(bb), "\t\treject with tcp reset\n", "", 1)
		}, "nft: table ip " + name + " holds"},
		{"limit raised", func() {
			tables.nft[name] = strings.Replace(answerTable(bb), "50/second", "5000/second", 1)
		}, "nft: table ip " + name + " holds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.tamper()
			st, err := fw.Check(ctx, bb)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Problems) != 1 || !strings.HasPrefix(st.Problems[0], tt.want) {
				t.Errorf("Check = %q, want one problem starting %q", st.Problems, tt.want)
			}
			if err := fw.Ensure(ctx, bb); err != nil {
				t.Fatal(err)
			}
			if st, err := fw.Check(ctx, bb); err != nil || !st.Intact() {
				t.Errorf("Check after repair = %+v, %v", st, err)
			}
		})
	}
	// A failing nft is an error, never "table missing".
	tables.fail = "nft list tables"
	if _, err := fw.Check(ctx, bb); err == nil {
		t.Error("Check with nft failing: no error")
	}
	tables.fail = ""
	if err := fw.Remove(ctx, br); err != nil {
		t.Fatal(err)
	}
	if _, ok := tables.nft[name]; ok {
		t.Error("table still there after Remove")
	}
}
