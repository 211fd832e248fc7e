package doctor

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// fakeHost is a host with every tool installed and working, which each
// test case then breaks in one place.
func fakeHost() Host {
	return Host{
		LookPath: func(f string) (string, error) { return "/usr/bin/" + f, nil },
		ReadFile: func(p string) ([]byte, error) { return []byte("1\n"), nil },
		Stat: func(p string) (fs.FileInfo, error) {
			if p == "/sys/module/kvm_pvm" {
				return nil, fs.ErrNotExist
			}
			return nil, nil
		},
		OpenKVM: func() error { return nil },
		Run: func(ctx context.Context, name string, args ...string) ([]byte, error) {
			return []byte(name + " v1 (nf_tables)"), nil
		},
		DialLibvirt: func(ctx context.Context) error { return nil },
		FreeBytes:   func(string) (uint64, error) { return 100 << 30, nil },
		Home:        "/var/lib/abox",
	}
}

func find(t *testing.T, r Report, name string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, r.Checks)
	return Check{}
}

func TestCheckDeps(t *testing.T) {
	tests := []struct {
		name   string
		breakF func(h *Host)
		check  string
		want   Status
		fix    string
	}{
		{"healthy", func(h *Host) {}, "tcpdump", Pass, ""},
		{"libvirtd down", func(h *Host) {
			h.DialLibvirt = func(context.Context) error { return errors.New("connection refused") }
		}, "libvirtd reachable", Fail, "libvirtd -d"},
		{"tcpdump missing", func(h *Host) {
			h.LookPath = func(f string) (string, error) {
				if f == "tcpdump" {
					return "", errors.New("not found")
				}
				return "/usr/bin/" + f, nil
			}
		}, "tcpdump", Fail, "apt-get install tcpdump"},
		{"tshark missing only warns", func(h *Host) {
			h.LookPath = func(f string) (string, error) {
				if f == "tshark" {
					return "", errors.New("not found")
				}
				return "/usr/bin/" + f, nil
			}
		}, "tshark", Warn, "apt-get install tshark"},
		{"qemu-img missing", func(h *Host) {
			h.LookPath = func(f string) (string, error) {
				if f == "qemu-img" {
					return "", errors.New("not found")
				}
				return "/usr/bin/" + f, nil
			}
		}, "qemu-img", Fail, "apt-get install qemu-utils"},
		{"iptables broken", func(h *Host) {
			h.Run = func(ctx context.Context, name string, args ...string) ([]byte, error) {
				if name == "iptables" && args[0] == "-L" {
					return []byte("can't initialize iptables table `filter'"), errors.New("exit status 3")
				}
				return nil, nil
			}
		}, "iptables backend", Fail, "modprobe"},
		{"no kvm", func(h *Host) { h.OpenKVM = func() error { return fs.ErrNotExist } }, "kvm", Warn, "--accel tcg"},
		{"pvm kvm", func(h *Host) { h.Stat = func(string) (fs.FileInfo, error) { return nil, nil } }, "kvm", Warn, "tcg"},
		{"bridge netfilter off", func(h *Host) {
			h.ReadFile = func(p string) ([]byte, error) {
				if strings.HasSuffix(p, "ip6tables") {
					return []byte("0\n"), nil
				}
				return []byte("1\n"), nil
			}
		}, "bridge netfilter", Fail, "sysctl -w"},
		{"br_netfilter not loaded", func(h *Host) {
			h.ReadFile = func(p string) ([]byte, error) { return nil, os.ErrNotExist }
		}, "bridge netfilter", Warn, "modprobe br_netfilter"},
		{"disk low", func(h *Host) { h.FreeBytes = func(string) (uint64, error) { return 1 << 30, nil } }, "disk space", Warn, "ABOX_HOME"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := fakeHost()
			tc.breakF(&h)
			r := CheckDeps(context.Background(), h)
			c := find(t, r, tc.check)
			if c.Status != tc.want {
				t.Errorf("%s = %s (%s), want %s", tc.check, c.Status, c.Detail, tc.want)
			}
			if !strings.Contains(c.Fix, tc.fix) {
				t.Errorf("fix %q does not contain %q", c.Fix, tc.fix)
			}
			if r.Failed() != (tc.want == Fail) {
				t.Errorf("Failed() = %v with %s", r.Failed(), tc.want)
			}
		})
	}
}

func TestRenderStripsControlCharacters(t *testing.T) {
	r := Report{Checks: []Check{{Layer: "guest", Name: "x", Status: Fail, Detail: "a\x1b[2Jb\nc\x07", Fix: "do\x1b]0;t\x07 it"}}}
	var b bytes.Buffer
	r.Render(&b)
	if strings.ContainsAny(b.String(), "\x1b\x07") {
		t.Fatalf("control characters reached the output: %q", b.String())
	}
	if !strings.Contains(b.String(), "FAIL guest") || !strings.Contains(b.String(), "fix: do") {
		t.Errorf("render = %q", b.String())
	}
}
