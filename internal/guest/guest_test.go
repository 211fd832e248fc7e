package guest

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

func testTarget(t *testing.T) Target {
	t.Helper()
	l := paths.Layout{Root: t.TempDir()}
	st := instance.State{Name: "dev", User: "abox", GuestIP: netip.MustParseAddr("10.10.5.10"),
		Gateway: netip.MustParseAddr("10.10.5.1"), ProxyPort: 3128}
	f := l.Instance(st.Name)
	if err := os.MkdirAll(filepath.Dir(f.SSHKey), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.SSHKey, []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Target{Layout: l, State: st}
}

func TestParseLocation(t *testing.T) {
	for _, tc := range []struct {
		in       string
		instance string
		path     string
		wantErr  bool
	}{
		{in: "dev:work/a.txt", instance: "dev", path: "work/a.txt"},
		{in: "dev:", instance: "dev", path: ""},
		{in: "dev:/etc/hosts", instance: "dev", path: "/etc/hosts"},
		{in: "./a:b", path: "./a:b"},
		{in: "/tmp/a:b", path: "/tmp/a:b"},
		{in: "plain.txt", path: "plain.txt"},
		{in: "dir/a:b", path: "dir/a:b"},
		{in: "9bad:x", wantErr: true},
		{in: "", wantErr: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseLocation(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && (got.Instance != tc.instance || got.Path != tc.path) {
				t.Errorf("got %+v, want instance %q path %q", got, tc.instance, tc.path)
			}
		})
	}
}

func TestCopyPlanNamesOneInstanceOnOneSide(t *testing.T) {
	host := Location{Path: "a"}
	dev := Location{Instance: "dev", Path: "a"}
	peer := Location{Instance: "peer", Path: "a"}
	for _, tc := range []struct {
		name    string
		p       CopyPlan
		want    string
		wantErr string
	}{
		{name: "to guest", p: CopyPlan{Sources: []Location{host, host}, Dest: dev}, want: "dev"},
		{name: "from guest", p: CopyPlan{Sources: []Location{dev, dev}, Dest: host}, want: "dev"},
		{name: "guest to guest", p: CopyPlan{Sources: []Location{dev}, Dest: peer}, wantErr: "both sides"},
		{name: "host to host", p: CopyPlan{Sources: []Location{host}, Dest: host}, wantErr: "neither side"},
		{name: "two instances", p: CopyPlan{Sources: []Location{dev, peer}, Dest: host}, wantErr: "two instances"},
		{name: "mixed sources", p: CopyPlan{Sources: []Location{dev, host}, Dest: host}, wantErr: "mix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.p.Instance()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestSCPIgnoresUserConfigAndKeepsHardening: scp must take no
// ssh_config (a RemoteForward there would hand the guest a host service)
// and keep every hardened option of abox ssh.
func TestSCPIgnoresUserConfigAndKeepsHardening(t *testing.T) {
	tg := testTarget(t)
	args, err := scpArgs(tg, CopyPlan{Sources: []Location{{Path: "./x"}}, Dest: Location{Instance: "dev", Path: "w/"}, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	j := strings.Join(args, " ")
	for _, want := range []string{"-F /dev/null", "ForwardAgent=no", "ClearAllForwardings=yes", "StrictHostKeyChecking=yes", "-r", "-- ./x abox@10.10.5.10:w/"} {
		if !strings.Contains(j, want) {
			t.Errorf("scp args lack %q: %s", want, j)
		}
	}
}

// TestForwardBindsLoopbackOnlyWithoutUserConfig: a forward listens on the
// host's 127.0.0.1 only, reaches only the guest's loopback, reads no
// ssh_config, and keeps agent and X11 forwarding off.
func TestForwardBindsLoopbackOnlyWithoutUserConfig(t *testing.T) {
	tg := testTarget(t)
	for _, tc := range []struct {
		f    Forward
		flag string
		spec string
	}{
		{Forward{HostPort: 8080, GuestPort: 80}, "-L", "127.0.0.1:8080:127.0.0.1:80"},
		{Forward{HostPort: 9000, GuestPort: 9001, Reverse: true}, "-R", "127.0.0.1:9001:127.0.0.1:9000"},
	} {
		args, err := forwardArgs(tg, tc.f)
		if err != nil {
			t.Fatal(err)
		}
		j := strings.Join(args, " ")
		if !strings.Contains(j, tc.flag+" "+tc.spec) {
			t.Errorf("%v: want %s %s in %s", tc.f, tc.flag, tc.spec, j)
		}
		for _, want := range []string{"-F /dev/null", "ForwardAgent=no", "ForwardX11=no", "ExitOnForwardFailure=yes", "StrictHostKeyChecking=yes"} {
			if !strings.Contains(j, want) {
				t.Errorf("forward args lack %q: %s", want, j)
			}
		}
		if strings.Contains(j, "ClearAllForwardings") {
			t.Errorf("ClearAllForwardings would drop the forward itself: %s", j)
		}
		if n := strings.Count(j, " -L ") + strings.Count(j, " -R "); n != 1 {
			t.Errorf("%d forwardings in %s, want 1", n, j)
		}
	}
}

func TestParseForward(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Forward
		wantErr bool
	}{
		{in: "8080:80", want: Forward{HostPort: 8080, GuestPort: 80}},
		{in: "1024:65535", want: Forward{HostPort: 1024, GuestPort: 65535}},
		// The host's privileged ports are its services' (ssh, DNS, SMTP).
		{in: "22:22", wantErr: true},
		{in: "53:53", wantErr: true},
		{in: "1023:80", wantErr: true},
		{in: "8080", wantErr: true},
		{in: "0:80", wantErr: true},
		{in: "8080:65536", wantErr: true},
		{in: "a:80", wantErr: true},
		{in: "127.0.0.1:8080:80", wantErr: true},
	} {
		got, err := ParseForward(tc.in, false)
		if (err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("ParseForward(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
	// A reverse forward names the host service offered: any port, asked
	// for by name.
	if f, err := ParseForward("22:2222", true); err != nil || f.HostPort != 22 {
		t.Errorf("reverse 22:2222 = %+v, %v", f, err)
	}
}

// TestForwardNeverListensOnAPrivilegedHostPort: AddForward itself refuses
// (whoever calls it: the CLI, abox up), before recording or starting
// anything.
func TestForwardNeverListensOnAPrivilegedHostPort(t *testing.T) {
	tg := testTarget(t)
	exe := filepath.Join(t.TempDir(), "fake-abox")
	os.WriteFile(exe, []byte("#!/bin/sh\nsleep 60\n"), 0o755)
	a := Access{Layout: tg.Layout, Exe: exe}
	for _, port := range []uint16{1, 22, 53, 631, 1023} {
		err := a.AddForward(t.Context(), tg, Forward{HostPort: port, GuestPort: 8080}, true)
		if err == nil || !strings.Contains(err.Error(), "privileged port") {
			t.Errorf("forward from host port %d: %v", port, err)
		}
	}
	if fs, err := a.Forwards("dev"); err != nil || len(fs) != 0 {
		t.Errorf("refused forwards were recorded: %+v, %v", fs, err)
	}
	// A host service on [::1] alone holds the port too.
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer ln.Close()
	p := uint16(ln.Addr().(*net.TCPAddr).Port)
	if err := a.AddForward(t.Context(), tg, Forward{HostPort: p, GuestPort: 8080}, true); err == nil || !strings.Contains(err.Error(), "[::1]") {
		t.Errorf("forward over a service on [::1]:%d: %v", p, err)
	}
	if fs, err := a.Forwards("dev"); err != nil || len(fs) != 0 {
		t.Errorf("refused forwards were recorded: %+v, %v", fs, err)
	}
}

// TestSSHFSResolvesGuestSymlinksInTheGuest: without follow_symlinks the
// host kernel would follow a guest-made link into the host's own files.
func TestSSHFSResolvesGuestSymlinksInTheGuest(t *testing.T) {
	tg := testTarget(t)
	args, err := sshfsArgs(tg, Mount{Dir: "/mnt/x", GuestPath: "work", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(args) != 4 || args[0] != "-o" || args[2] != "abox@10.10.5.10:work" || args[3] != "/mnt/x" {
		t.Fatalf("args = %q", args)
	}
	opts := map[string]bool{}
	for _, o := range strings.Split(args[1], ",") {
		opts[o] = true
	}
	for _, want := range []string{"follow_symlinks", "nosuid", "nodev", "noexec", "ro"} {
		if !opts[want] {
			t.Errorf("sshfs options lack %s: %s", want, args[1])
		}
	}
	if !strings.Contains(args[1], "ssh_command=ssh -F /dev/null ") || !strings.Contains(args[1], "ForwardAgent=no") {
		t.Errorf("ssh_command not hardened: %s", args[1])
	}
	bad := testTarget(t)
	bad.Layout.Root = filepath.Join(bad.Layout.Root, "a b")
	f := bad.Layout.Instance("dev")
	os.MkdirAll(filepath.Dir(f.SSHKey), 0o700)
	os.WriteFile(f.SSHKey, []byte("k"), 0o600)
	if _, err := sshfsArgs(bad, Mount{Dir: "/mnt/x"}); err == nil {
		t.Error("a blank in the key path was passed to sshfs")
	}
}

func TestScanOverlayRefusesWhatCouldLeaveIt(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc", "app"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc", "app", "conf"), []byte("x=1\n"), 0o640)
	o, root, err := OpenOverlay(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	entries, total, err := scanOverlay(*o)
	if err != nil || total != 4 || len(entries) != 3 {
		t.Fatalf("scan = %+v, %d, %v", entries, total, err)
	}
	var buf bytes.Buffer
	if err := writeOverlayTar(&buf, *o, entries); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		names = append(names, h.Name)
		if h.Name == "./etc/app/conf" {
			if b, _ := io.ReadAll(tr); string(b) != "x=1\n" || h.Mode != 0o640 {
				t.Errorf("conf = %q mode %o", b, h.Mode)
			}
		}
	}
	if strings.Join(names, " ") != "./etc/ ./etc/app/ ./etc/app/conf" {
		t.Errorf("tar names = %q", names)
	}

	for name, mk := range map[string]func(d string) error{
		"symlink to a host file": func(d string) error { return os.Symlink("/etc/shadow", filepath.Join(d, "evil")) },
		"symlinked directory":    func(d string) error { return os.Symlink("/root", filepath.Join(d, "home")) },
		"fifo":                   func(d string) error { return syscall.Mkfifo(filepath.Join(d, "pipe"), 0o644) },
	} {
		t.Run(name, func(t *testing.T) {
			d := t.TempDir()
			if err := mk(d); err != nil {
				t.Fatal(err)
			}
			o, root, err := OpenOverlay(d, "")
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			if _, _, err := scanOverlay(*o); err == nil {
				t.Error("overlay accepted")
			}
		})
	}
	t.Run("too many bytes", func(t *testing.T) {
		fsys := fstest.MapFS{"big": &fstest.MapFile{Data: make([]byte, 10)}}
		_, _, err := scanOverlay(Overlay{FS: sparseFS{fsys, MaxOverlayBytes + 1}, Source: "x"})
		if err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Errorf("err = %v", err)
		}
	})
}

// sparseFS reports every file as size bytes (a huge file without the disk).
type sparseFS struct {
	fstest.MapFS
	size int64
}

func (s sparseFS) ReadDir(name string) ([]os.DirEntry, error) {
	es, err := s.MapFS.ReadDir(name)
	for i, e := range es {
		es[i] = sizedEntry{e, s.size}
	}
	return es, err
}

type sizedEntry struct {
	os.DirEntry
	size int64
}

func (e sizedEntry) Info() (os.FileInfo, error) {
	fi, err := e.DirEntry.Info()
	return sizedInfo{fi, e.size}, err
}

type sizedInfo struct {
	os.FileInfo
	size int64
}

func (i sizedInfo) Size() int64 { return i.size }

func TestReadScriptLimits(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "ok.sh"), []byte("#!/bin/sh\necho hi\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "big.sh"), make([]byte, MaxScriptBytes+1), 0o644)
	os.Mkdir(filepath.Join(dir, "dir"), 0o755)
	syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(dir, "out.sh"))
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if s, err := ReadScript(root, "ok.sh"); err != nil || !strings.Contains(string(s.Content), "echo hi") {
		t.Errorf("ok.sh: %v", err)
	}
	for _, n := range []string{"big.sh", "dir", "missing.sh", "fifo", "out.sh"} {
		if _, err := ReadScript(root, n); err == nil {
			t.Errorf("%s accepted", n)
		}
	}
}

func TestScriptCommandCarriesProxyEnvironment(t *testing.T) {
	c := scriptCommand(testTarget(t), "x.sh")
	for _, want := range []string{"sudo -n -H env", "'https_proxy=http://10.10.5.1:3128'", "'REQUESTS_CA_BUNDLE=", "sh -c '"} {
		if !strings.Contains(c, want) {
			t.Errorf("command lacks %q: %s", want, c)
		}
	}
}

func TestMountinfo(t *testing.T) {
	mi := "36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - fuse.sshfs abox@10.10.5.10:work rw\n"
	if ok, _ := mountinfoHas(strings.NewReader(mi), "/mnt/a b"); !ok {
		t.Error("escaped mount point not found")
	}
	if ok, _ := mountinfoHas(strings.NewReader(mi), "/mnt/a"); ok {
		t.Error("prefix matched")
	}
}

// TestForwardRecordsAndSupervisors: a forward is recorded, its supervisor
// is found by pid and command line, remove stops it and forgets it, and a
// recorded forward survives Release (stop) for Resume (start).
func TestForwardRecordsAndSupervisors(t *testing.T) {
	tg := testTarget(t)
	// A stand-in supervisor: it keeps the command line abox forward run
	// would have and waits to be ended.
	exe := filepath.Join(t.TempDir(), "fake-abox")
	os.WriteFile(exe, []byte("#!/bin/sh\nsleep 60\n"), 0o755)
	a := Access{Layout: tg.Layout, Exe: exe}
	f := Forward{HostPort: freeHostPort(t), GuestPort: 9, Reverse: true}
	if err := a.AddForward(t.Context(), tg, f, true); err != nil {
		t.Fatal(err)
	}
	if err := a.AddForward(t.Context(), tg, f, true); !errors.Is(err, ErrForwardExists) {
		t.Errorf("second add: %v", err)
	}
	fs, err := a.Forwards("dev")
	if err != nil || len(fs) != 1 || !fs[0].Active {
		t.Fatalf("after add: %+v, %v", fs, err)
	}
	pid := a.forwardPID("dev", f)
	if err := a.Release(t.Context(), "dev"); err != nil {
		t.Fatal(err)
	}
	if fs, _ := a.Forwards("dev"); len(fs) != 1 || fs[0].Active {
		t.Errorf("after release: %+v, want recorded and stopped", fs)
	}
	// The stand-in is this test's child, reaped as soon as it exits.
	for i := 0; i < 500 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("supervisor %d still runs after release", pid)
	}
	if err := a.Resume(t.Context(), "dev"); err != nil {
		t.Fatal(err)
	}
	if fs, _ := a.Forwards("dev"); len(fs) != 1 || !fs[0].Active {
		t.Errorf("after resume: %+v", fs)
	}
	if err := a.RemoveForward(t.Context(), "dev", f); err != nil {
		t.Fatal(err)
	}
	if fs, _ := a.Forwards("dev"); len(fs) != 0 {
		t.Errorf("after remove: %+v", fs)
	}
	if err := a.RemoveForward(t.Context(), "dev", f); err == nil {
		t.Error("removing a forward twice")
	}
}

// freeHostPort is a loopback port nothing listens on now, on both families
// (a fixed port collides with whatever else runs on the machine).
func freeHostPort(t *testing.T) uint16 {
	t.Helper()
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		if port >= 1024 && hostPortFree(port) == nil {
			return port
		}
	}
	t.Fatal("no free loopback port")
	return 0
}

// TestResumeRechecksHostPorts: start binds a recorded forward's host port
// again only after the same check as forward add: a port a host service
// took since is refused with the fix, and no supervisor starts for it.
func TestResumeRechecksHostPorts(t *testing.T) {
	tg := testTarget(t)
	exe := filepath.Join(t.TempDir(), "fake-abox")
	os.WriteFile(exe, []byte("#!/bin/sh\nsleep 60\n"), 0o755)
	a := Access{Layout: tg.Layout, Exe: exe}
	f := Forward{HostPort: freeHostPort(t), GuestPort: 80}
	if err := a.AddForward(t.Context(), tg, f, false); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(f.HostPort))))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = a.Resume(t.Context(), "dev")
	if err == nil || !strings.Contains(err.Error(), "not free") || !strings.Contains(err.Error(), "abox forward rm") {
		t.Errorf("resume with the host port taken: %v", err)
	}
	if pid := a.forwardPID("dev", f); pid != 0 {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("a forward supervisor started on a taken host port")
	}
}
