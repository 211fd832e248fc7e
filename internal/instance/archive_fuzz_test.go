package instance

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"

	"github.com/abox-dev/abox/internal/archive"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/termtext"
)

// FuzzImportedState feeds an archive's state (as the manifest carries it)
// to the import's decoding and checks. Whatever passes names no host
// path but the new instance's own files (never a credentials path: that
// is this host's, a flag's), no /0 range, carries no fresh
// field over, uses abox's proxy port, and holds only printable strings
// where abox shows them.
func FuzzImportedState(f *testing.F) {
	l := paths.Layout{Root: "/var/lib/abox"}
	seed := State{Name: "dev", UUID: "4f1c2a7e-9b3d-4c5e-8f6a-0b1c2d3e4f50", Base: "debian-12", CPUs: 2, MemoryMiB: 1024, DiskGiB: 10, User: "abox", Accel: "tcg", ProxyPort: DefaultProxyPort,
		Kernel: "/var/lib/abox/images/debian-12/kernel", Initrd: "/var/lib/abox/images/debian-12/initrd.img", Cmdline: "console=ttyS0", UpstreamCA: "/var/lib/abox/instances/dev/upstream-ca.pem", Upstreams: []string{"192.0.2.53"},
		MonitorBundle: &MonitorBundle{SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Source: "release v1.7.1", Path: "/etc/shadow"}, Monitor: true}
	good, _ := json.Marshal(seed)
	f.Add(good, true)
	f.Add([]byte(`{"name":"x","user":"root","proxy_port":22,"kernel":"/etc/passwd"}`), false)
	f.Fuzz(func(t *testing.T, data []byte, carried bool) {
		var src State
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if dec.Decode(&src) != nil {
			return
		}
		has := map[string]bool{archive.Allowlist: true, archive.CACert: true, archive.CAKey: true, archive.SSHKey: true}
		if carried {
			for _, e := range []string{archive.UpstreamCA, archive.Kernel, archive.Initrd, archive.MonitorBundle} {
				has[e] = true
			}
		}
		st, err := importedState(&Manager{Layout: l}, src, "imported", has, "")
		if err != nil {
			if bytes.Equal(data, good) && carried {
				t.Fatalf("the seed of a good state is refused: %v", err)
			}
			return
		}
		own := l.Instance("imported")
		for _, p := range []struct{ what, got, want string }{{"upstream CA", st.UpstreamCA, filepath.Join(own.Dir, "upstream-ca.pem")}, {"kernel", st.Kernel, own.Kernel}, {"initrd", st.Initrd, own.Initrd}} {
			if p.got != "" && p.got != p.want {
				t.Fatalf("%s %q kept; want the instance's own %s", p.what, p.got, p.want)
			}
		}
		if st.UpstreamProxyCredentials != "" {
			t.Fatalf("credentials path %q taken from the archive", st.UpstreamProxyCredentials)
		}
		for _, p := range append(slices.Clone(st.AllowPrivate), st.AllowHost...) {
			if p.Bits() == 0 || p != p.Masked() {
				t.Fatalf("range %s accepted", p)
			}
		}
		if st.UpstreamProxy != "" && len(ImportWidenings(st, nil)) == 0 {
			t.Fatal("an upstream proxy that the trust list does not show")
		}
		if st.Name != "imported" || st.UUID == src.UUID || st.Subnet.IsValid() || st.GuestIP.IsValid() || st.Gateway.IsValid() || st.Bridge != "" || st.MAC != "" {
			t.Fatalf("fresh fields carried: %+v", st)
		}
		if st.ProxyPort != DefaultProxyPort || st.User == "root" || (st.Accel != "kvm" && st.Accel != "tcg") {
			t.Fatalf("accepted %+v", st)
		}
		for _, s := range []string{st.Cmdline, st.UpstreamProxyCredentials, st.User, st.Base} {
			if termtext.Check(s) != nil {
				t.Fatalf("unprintable %q accepted", s)
			}
		}
		if st.MonitorBundle != nil && termtext.Check(st.MonitorBundle.Source) != nil {
			t.Fatalf("unprintable bundle source %q accepted", st.MonitorBundle.Source)
		}
	})
}
