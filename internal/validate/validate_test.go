package validate

import (
	"bytes"
	"strings"
	"testing"
)

func TestInstanceName(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // substring; empty means valid
	}{
		{"simple", "dev", ""},
		{"single letter", "a", ""},
		{"mixed", "Agent_1-x", ""},
		{"63 chars", "a" + strings.Repeat("b", 62), ""},
		{"64 chars", "a" + strings.Repeat("b", 63), "64 bytes long"},
		{"empty", "", "empty"},
		{"leading digit", "1dev", "start with a letter"},
		{"leading hyphen", "-dev", "start with a letter"},
		{"leading underscore", "_dev", "start with a letter"},
		{"xml injection", "a'><x", `contains '\''`},
		{"xml quote", `a"b`, `contains '"'`},
		{"ampersand", "a&b", "contains '&'"},
		{"space", "a b", "contains ' '"},
		{"slash traversal", "a/../b", "contains '/'"},
		{"dot", "a.b", "contains '.'"},
		{"newline", "a\nb", `contains '\n'`},
		{"nul", "a\x00b", `contains '\x00'`},
		{"shell", "a;rm", "contains ';'"},
		{"unicode letter", "dév", "contains 'é'"},
		{"unicode lookalike start", "аdev", "start with a letter"}, // Cyrillic а
		{"invalid utf8", "a\xffb", "not valid UTF-8"},
		{"iptables option", "a --jump ACCEPT", "contains ' '"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := InstanceName(tt.in)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("InstanceName(%q) = %v, want nil", tt.in, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("InstanceName(%q) = nil, want error containing %q", tt.in, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("InstanceName(%q) = %q, want it to contain %q", tt.in, err, tt.wantErr)
			}
			// The error must tell the user how to fix it.
			if !strings.Contains(err.Error(), "use something like") {
				t.Errorf("InstanceName(%q) error %q carries no fix", tt.in, err)
			}
		})
	}
}

func TestMAC(t *testing.T) {
	tests := []struct {
		in        string
		wantMAC   bool
		wantGuest bool
	}{
		{"52:54:00:12:34:56", true, true},
		{"52:54:00:AB:cd:EF", true, true},
		{"02:00:00:00:00:01", true, true},  // locally administered
		{"00:11:22:33:44:55", true, false}, // globally administered
		{"01:00:5e:00:00:01", true, false}, // multicast
		{"ff:ff:ff:ff:ff:ff", true, false}, // broadcast
		{"03:00:00:00:00:01", true, false}, // local but multicast
		{"52-54-00-12-34-56", false, false},
		{"5254.0012.3456", false, false},
		{"52:54:00:12:34", false, false},
		{"52:54:00:12:34:56:78", false, false},
		{"52:54:00:12:34:5g", false, false},
		{"52:54:00:12:34:56'/><x", false, false},
		{"52:54:00:12:34:56\n", false, false},
		{"", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if err := MAC(tt.in); (err == nil) != tt.wantMAC {
				t.Errorf("MAC(%q) = %v, want valid=%v", tt.in, err, tt.wantMAC)
			}
			if err := GuestMAC(tt.in); (err == nil) != tt.wantGuest {
				t.Errorf("GuestMAC(%q) = %v, want valid=%v", tt.in, err, tt.wantGuest)
			}
		})
	}
}

func TestNewMAC(t *testing.T) {
	got, err := NewMAC(bytes.NewReader([]byte{0xab, 0x01, 0xff}))
	if err != nil {
		t.Fatal(err)
	}
	if want := "52:54:00:ab:01:ff"; got != want {
		t.Errorf("NewMAC = %q, want %q", got, want)
	}
	if err := GuestMAC(got); err != nil {
		t.Errorf("generated MAC fails GuestMAC: %v", err)
	}
	if _, err := NewMAC(bytes.NewReader([]byte{1})); err == nil {
		t.Error("NewMAC with a short reader: want error")
	}
	rnd, err := NewMAC(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := GuestMAC(rnd); err != nil {
		t.Errorf("random MAC %q fails GuestMAC: %v", rnd, err)
	}
}

func TestBridgeName(t *testing.T) {
	seen := map[string]string{}
	for _, inst := range []string{"a", "dev", "Dev", "dev2", "agent-1", "agent_1", "a" + strings.Repeat("z", 62)} {
		br, err := BridgeName(inst)
		if err != nil {
			t.Fatalf("BridgeName(%q): %v", inst, err)
		}
		if len(br) > MaxBridgeLen {
			t.Errorf("BridgeName(%q) = %q, longer than %d", inst, br, MaxBridgeLen)
		}
		if !strings.HasPrefix(br, BridgePrefix) {
			t.Errorf("BridgeName(%q) = %q, want prefix %q", inst, br, BridgePrefix)
		}
		if err := Bridge(br); err != nil {
			t.Errorf("BridgeName(%q) = %q, which Bridge refuses: %v", inst, br, err)
		}
		if other, dup := seen[br]; dup {
			t.Errorf("BridgeName(%q) = BridgeName(%q) = %q", inst, other, br)
		}
		seen[br] = inst
		again, _ := BridgeName(inst)
		if again != br {
			t.Errorf("BridgeName(%q) not deterministic: %q then %q", inst, br, again)
		}
	}
	if got, want := mustBridge(t, "dev"), "abx-ef260e9aa3c"; got != want {
		t.Errorf("BridgeName(dev) = %q, want %q (changing it orphans existing bridges and firewall chains)", got, want)
	}
	if _, err := BridgeName("1bad"); err == nil {
		t.Error("BridgeName(1bad): want error")
	}
}

func mustBridge(t *testing.T, inst string) string {
	t.Helper()
	br, err := BridgeName(inst)
	if err != nil {
		t.Fatal(err)
	}
	return br
}

func TestBridge(t *testing.T) {
	for _, tt := range []struct {
		in string
		ok bool
	}{
		{"abx-0123456789a", true},
		{"virbr0", true},
		{"abx-0123456789ab", false}, // 16 chars
		{"", false},
		{"-i", false},
		{"br 0", false},
		{"br;x", false},
	} {
		if err := Bridge(tt.in); (err == nil) != tt.ok {
			t.Errorf("Bridge(%q) = %v, want ok=%v", tt.in, err, tt.ok)
		}
	}
}

func TestSnapshotName(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // substring; empty means valid
	}{
		{"simple", "before-upgrade", ""},
		{"dotted", "v2.1", ""},
		{"timestamp", "20261202-150405", ""},
		{"leading digit", "1st", ""},
		{"63 chars", "a" + strings.Repeat("b", 62), ""},
		{"64 chars", "a" + strings.Repeat("b", 63), "64 bytes long"},
		{"empty", "", "empty"},
		{"all digits", "2", "snapshot id"},
		{"long all digits", "1701529405", "snapshot id"},
		{"dot dot", "..", "start with a letter or a digit"},
		{"leading dot", ".hidden", "start with a letter or a digit"},
		{"leading hyphen", "-rf", "start with a letter or a digit"},
		{"slash traversal", "a/../b", "contains '/'"},
		{"xml injection", "a'><x", `contains '\''`},
		{"ampersand", "a&b", "contains '&'"},
		{"space", "a b", "contains ' '"},
		{"newline", "a\nb", `contains '\n'`},
		{"unicode", "ünder", "start with a letter or a digit"},
		{"invalid utf8", "a\xffb", "not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := SnapshotName(tt.in)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("SnapshotName(%q) = %v, want nil", tt.in, err)
			case tt.wantErr != "" && err == nil:
				t.Errorf("SnapshotName(%q) = nil, want error containing %q", tt.in, tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Errorf("SnapshotName(%q) = %v, want it to contain %q", tt.in, err, tt.wantErr)
			}
		})
	}
}
