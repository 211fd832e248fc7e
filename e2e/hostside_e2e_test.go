//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/testutil/need"
)

// needVM skips a VM test that cannot run here, except under CI (CI=true),
// where it fails: a suite that silently skips proves nothing.
func needVM(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("cannot run under CI: %s", reason)
	}
	t.Skip(reason)
}

// TestHostSide boots one guest and checks the host side of the sandbox:
// the files of a running instance are private, the host answers the
// guest's ARP only for the gateway, the guard repairs removed chains, a
// guest started with virsh without its chains or filters is refused by
// the libvirt hook, templates that name host files are refused, and stop
// and remove leave nothing behind (also for a damaged instance).
func TestHostSide(t *testing.T) {
	if os.Geteuid() != 0 {
		needVM(t, "the VM suite needs root (libvirt, namespaces, iptables)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	s := &suite{t: t, ctx: ctx, tmp: t.TempDir()}
	os.Chmod(s.tmp, 0o755)
	if _, err := (image.Builder{Run: image.ExecRunner{}}).BuildDebian12(ctx, os.Getenv("ABOX_DEBIAN_MIRROR"), os.Getenv("ABOX_IMAGE_CACHE"), nil); err != nil {
		t.Fatalf("building the base image: %v", err)
	}
	l, err := lab.Start(ctx, "..", "hs", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	s.lab, s.env, s.home = l, l.Env, l.Home
	layout := paths.Layout{Root: s.home}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer ccancel()
		s.ctx = cctx
		if t.Failed() {
			if b, err := os.ReadFile(layout.Instance("hs").DaemonLog); err == nil {
				t.Logf("hs daemon.log:\n%s", tail(string(b), 30))
			}
		}
		for _, n := range []string{"hs", "dmg", "tpl"} {
			s.abox("remove", "--force", n)
		}
		if err := l.Close(cctx); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	s.mustAbox("base", "build", "debian-12")

	t.Run("templates naming host files are refused and leave nothing", func(t *testing.T) {
		for name, dev := range map[string]string{
			"serial file": `<serial type='file'><source path='/etc/cron.d/abox-evil'/><target port='1'/></serial>`,
			"host disk":   `<disk type='block' device='disk'><source dev='/dev/sda'/><target dev='vdc' bus='virtio'/></disk>`,
			"custom qemu": `<emulator>/tmp/evil-qemu</emulator>`,
			"nvdimm":      `<memory model='nvdimm'><source><path>/etc/shadow</path></source><target><size unit='KiB'>524288</size><node>0</node></target></memory>`,
			"host dir":    `<filesystem type='mount'><source dir='/root'/><target dir='r'/></filesystem>`,
			"pstore":      `<pstore backend='acpi-erst'><path>/etc/shadow</path><size unit='KiB'>8</size></pstore>`,
		} {
			tmpl := `<domain type='{{.DomainType}}'><name>{{.DomainName}}</name><uuid>{{.UUID}}</uuid>
<memory unit='MiB'>{{.MemoryMiB}}</memory><vcpu>{{.CPUs}}</vcpu><os><type arch='x86_64'>hvm</type></os>
<devices><disk type='file' device='disk'><source file='{{.DiskPath}}'/><target dev='vda' bus='virtio'/></disk>
<interface type='network'><mac address='{{.MAC}}'/><source network='{{.NetworkName}}'/><filterref filter='{{.FilterName}}'/></interface>` + dev + `</devices></domain>`
			p := filepath.Join(s.tmp, "tpl.xml")
			os.WriteFile(p, []byte(tmpl), 0o644)
			out, err := s.abox("create", "tpl", "--accel", "tcg", "--template", p)
			if err == nil || !strings.Contains(out, "not allowed") {
				t.Errorf("%s: create with the template = %v\n%s", name, err, out)
			}
			if _, err := os.Stat(paths.Layout{Root: s.home}.InstanceDir("tpl")); err == nil {
				t.Errorf("%s: a refused create left its directory", name)
			}
			if out, _ := s.env.Virsh(s.ctx, "list", "--all", "--name"); strings.Contains(out, "abox-tpl") {
				t.Errorf("%s: a refused create left its domain", name)
			}
		}
	})

	allow := filepath.Join(s.tmp, "allow.txt")
	os.WriteFile(allow, []byte("allowed.test\n"), 0o644)
	s.mustAbox("create", "hs", "--accel", "tcg", "--cpus", "1", "--memory", "768", "--allowlist", allow, "--upstream", upstreamDN, "--upstream-ca", l.OriginCA)
	hs := s.state("hs")
	out := s.mustAbox("start", "hs")
	if !strings.Contains(out, "br_netfilter") {
		t.Errorf("start output does not say that bridge netfilter affects every bridge:\n%s", out)
	}
	if err := s.waitSSH("hs", 12*time.Minute); err != nil {
		t.Fatal(err)
	}
	fw := hostfw.New(nsRunner{s})
	b := instance.FirewallBridge(hs)

	t.Run("every file of a running instance is private", func(t *testing.T) {
		bad, err := instance.CheckPrivate(layout, "hs")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bad {
			t.Error(line)
		}
	})

	nic := s.mustGuest(t, "hs", "ip -o -4 addr show | awk '$4 ~ /^"+strings.TrimSuffix(hs.GuestIP.String(), ".10")+"\\./ {print $2; exit}'")
	t.Run("the host answers ARP only for the gateway", func(t *testing.T) {
		// An on-link route makes the guest ARP for another host address
		// (the lab's uplink end) instead of asking the gateway.
		s.mustGuest(t, "hs", "sudo ip route replace "+lab.HostSide+"/32 dev "+nic)
		resolves := func(addr string) bool {
			out, _ := s.guest("hs", "sudo ip neigh flush to "+addr+" dev "+nic+"; echo x > /dev/udp/"+addr+"/9; sleep 2; ip neigh show "+addr+" dev "+nic)
			return strings.Contains(out, "lladdr")
		}
		if resolves(lab.HostSide) {
			t.Errorf("the host answered the guest's ARP for its address %s", lab.HostSide)
		}
		if !resolves(hs.Gateway.String()) {
			t.Errorf("the gateway %s does not answer ARP", hs.Gateway)
		}
		// Control: with Linux's default the host answers (the guard is
		// paused meanwhile, or it would put the switch back at once);
		// then the guard puts the switch back.
		sup := s.daemonPID(t, "hs")
		syscall.Kill(sup, syscall.SIGSTOP)
		if out, err := s.inNS(10*time.Second, "sysctl", "-w", "net.ipv4.conf."+hs.Bridge+".arp_ignore=0"); err != nil {
			syscall.Kill(sup, syscall.SIGCONT)
			t.Fatalf("%v: %s", err, out)
		}
		answered := resolves(lab.HostSide)
		syscall.Kill(sup, syscall.SIGCONT)
		if !answered {
			t.Errorf("control: with arp_ignore=0 the host still did not answer for %s; the test proves nothing", lab.HostSide)
		}
		if err := poll(s.ctx, 30*time.Second, func() bool {
			st, err := fw.Check(s.ctx, b)
			return err == nil && st.Intact()
		}); err != nil {
			t.Errorf("the guard did not restore arp_ignore: %v", err)
		}
		if resolves(lab.HostSide) {
			t.Errorf("after the guard's repair the host answers ARP for %s again", lab.HostSide)
		}
		s.guest("hs", "sudo ip route del "+lab.HostSide+"/32 dev "+nic)
	})

	t.Run("spoofed ARP, non-IP ethertypes and VLAN-tagged frames never leave the guest", func(t *testing.T) {
		// tcpdump on the host side of the bridge sees what passed the
		// guest's packet filter. The guest sends, from a raw socket: an
		// ARP reply claiming another address of its subnet, a frame of a
		// local experimental ethertype, a VLAN-tagged IPv4 frame; and, as
		// the control that the capture works, an ARP request for the
		// gateway from its own address.
		spoofIP := hs.Subnet.Addr().Next().Next().Next() // .3
		ctx, cancel := context.WithTimeout(s.ctx, 40*time.Second)
		defer cancel()
		need.Program(t, "tcpdump")
		dump := s.env.NetCommand(ctx, "tcpdump", "-l", "-n", "-e", "-i", hs.Bridge, "-c", "20",
			"ether src "+hs.MAC+" and (arp or ether proto 0x88b5 or vlan)")
		var buf strings.Builder
		dump.Stdout = &buf
		if err := dump.Start(); err != nil {
			t.Fatalf("tcpdump: %v", err)
		}
		time.Sleep(2 * time.Second)
		py := `import socket, struct
def mac(m): return bytes(int(x, 16) for x in m.split(':'))
def ip(a): return socket.inet_aton(a)
me, gw, spoof, nic = mac('` + hs.MAC + `'), '` + hs.Gateway.String() + `', '` + spoofIP.String() + `', '` + nic + `'
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((nic, 0))
bc = b'\xff' * 6
arp = lambda op, sip, tip: bc + me + b'\x08\x06' + struct.pack('!HHBBH', 1, 0x0800, 6, 4, op) + me + ip(sip) + b'\x00' * 6 + ip(tip)
for i in range(3):
    s.send(arp(2, spoof, gw))
    s.send(bc + me + b'\x88\xb5' + b'abox-ethertype'.ljust(46, b'.'))
    s.send(bc + me + b'\x81\x00\x00\x05\x08\x00' + b'\x45' + b'\x00' * 45)
s.send(arp(1, '` + hs.GuestIP.String() + `', gw))
`
		if out, err := s.guest("hs", "sudo python3 -c \""+strings.ReplaceAll(py, `"`, `\"`)+"\""); err != nil {
			t.Fatalf("sending raw frames: %v\n%s", err, out)
		}
		time.Sleep(3 * time.Second)
		dump.Process.Signal(syscall.SIGINT)
		dump.Wait()
		got := buf.String()
		if !strings.Contains(got, "Request who-has "+hs.Gateway.String()+" tell "+hs.GuestIP.String()) {
			t.Fatalf("control: the guest's own ARP request was not captured; the test proves nothing:\n%s", got)
		}
		for what, sign := range map[string]string{"spoofed ARP reply": "Reply " + spoofIP.String(), "ethertype 0x88b5": "0x88b5", "VLAN-tagged frame": "vlan 5"} {
			if strings.Contains(got, sign) {
				t.Errorf("%s left the guest:\n%s", what, got)
			}
		}
	})

	t.Run("the DNS and HTTP filters alone: no nwfilter, no host chains, no libvirt chains", func(t *testing.T) {
		s.filtersAlone(t, hs, fw)
	})

	t.Run("the nwfilter alone: no host chains, no libvirt chains, forwarding on", func(t *testing.T) {
		// Pause the guard (the supervisor; the filter process serves on),
		// take abox's chains and libvirt's reject rules away: only the
		// guest's nwfilter is left between it and the host and the world.
		sup := s.daemonPID(t, "hs")
		syscall.Kill(sup, syscall.SIGSTOP)
		defer syscall.Kill(sup, syscall.SIGCONT)
		if err := fw.Remove(s.ctx, hs.Bridge); err != nil {
			t.Fatal(err)
		}
		defer fw.Ensure(s.ctx, b)
		for _, c := range []string{"LIBVIRT_FWI", "LIBVIRT_FWO", "LIBVIRT_FWX", "LIBVIRT_INP", "LIBVIRT_OUT"} {
			s.inNS(10*time.Second, "iptables", "-w", "10", "-F", c)
		}
		gw := hs.Gateway.String()
		for what, cmd := range map[string]string{
			"direct egress to the origin":   "curl -sS -m 6 --noproxy '*' http://" + originIP + "/direct",
			"a host service on the gateway": "curl -sS -m 6 --noproxy '*' http://" + gw + ":8081/",
			"a host service elsewhere":      "curl -sS -m 6 --noproxy '*' http://" + lab.HostSide + ":8081/",
		} {
			if out, err := s.guest("hs", cmd); err == nil && strings.TrimSpace(out) != "" {
				t.Errorf("with only the nwfilter, %s worked: %q", what, out)
			}
		}
		for _, tcp := range []string{"+notcp", "+tcp"} {
			if out := s.mustGuest(t, "hs", "dig "+tcp+" +short +tries=2 +time=4 @"+gw+" allowed.test"); !hasLine(out, originIP) {
				t.Errorf("control: DNS (%s) to the gateway with only the nwfilter = %q, want %s", tcp, out, originIP)
			}
		}
	})

	t.Run("the guard repairs chains removed under a running guest", func(t *testing.T) {
		hostSvc := "curl -sS -m 6 --noproxy '*' http://" + hs.Gateway.String() + ":8081/"
		for _, rule := range [][]string{
			{"-D", "INPUT", "-i", hs.Bridge, "-j", hostfw.InputChainName(hs.Bridge)},
			{"-I", "FORWARD", "-i", hs.Bridge, "-j", "ACCEPT"},
			{"-F", hostfw.InputChainName(hs.Bridge)},
		} {
			if out, err := s.inNS(10*time.Second, "iptables", append([]string{"-w", "10", "-t", hostfw.Table}, rule...)...); err != nil {
				t.Fatalf("%v: %v: %s", rule, err, out)
			}
			if err := poll(s.ctx, 30*time.Second, func() bool {
				st, err := fw.Check(s.ctx, b)
				return err == nil && st.Intact()
			}); err != nil {
				st, _ := fw.Check(s.ctx, b)
				t.Errorf("after iptables %v the chains were not repaired: %v %q", rule, err, st.Problems)
			}
			if out, err := s.guest("hs", hostSvc); err == nil || strings.Contains(out, "HOST SERVICE") {
				t.Errorf("after iptables %v and the repair the guest reached a host service: %q", rule, out)
			}
		}
		// The ACCEPT someone inserted stays, below abox's jumps.
		s.inNS(10*time.Second, "iptables", "-w", "10", "-t", hostfw.Table, "-D", "FORWARD", "-i", hs.Bridge, "-j", "ACCEPT")
	})

	t.Run("libvirtd restarts under a running guest", func(t *testing.T) {
		if err := l.RestartLibvirtd(s.ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.waitSSH("hs", 2*time.Minute); err != nil {
			s.logNetState(t, hs)
			t.Fatalf("guest unreachable after a libvirtd restart: %v", err)
		}
		if err := poll(s.ctx, 30*time.Second, func() bool {
			st, err := fw.Check(s.ctx, b)
			return err == nil && st.Intact()
		}); err != nil {
			st, _ := fw.Check(s.ctx, b)
			t.Errorf("host chains after a libvirtd restart: %q", st.Problems)
		}
		if out, err := s.guest("hs", "curl -sS -m 6 --noproxy '*' http://"+hs.Gateway.String()+":8081/"); err == nil || strings.Contains(out, "HOST SERVICE") {
			t.Errorf("after a libvirtd restart the guest reached a host service: %q", out)
		}
	})

	t.Run("a libvirt network restart under a running guest", func(t *testing.T) {
		s.networkRestart(t, hs, fw, nic)
	})

	t.Run("a guest started outside abox without its layers is refused", func(t *testing.T) {
		s.mustAbox("stop", "--force", "hs")
		// What a host reboot, or someone with virsh, leaves: no filters,
		// no chains; the network can be started by hand.
		if err := fw.Remove(s.ctx, hs.Bridge); err != nil {
			t.Fatal(err)
		}
		if out, err := s.env.Virsh(s.ctx, "net-start", "abox-hs"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		out, err := s.env.Virsh(s.ctx, "start", "abox-hs")
		if err == nil {
			t.Fatalf("virsh start without the chains and filters succeeded:\n%s", out)
		}
		if !strings.Contains(out, "refusing to start hs") || !strings.Contains(out, "missing") || !strings.Contains(out, "filter daemon") {
			t.Errorf("virsh start was refused, but not by the hook naming what is missing:\n%s", out)
		}
		// Chains back, daemon still down: refused all the same.
		if err := fw.Ensure(s.ctx, b); err != nil {
			t.Fatal(err)
		}
		if out, err := s.env.Virsh(s.ctx, "start", "abox-hs"); err == nil || !strings.Contains(out, "filter daemon") {
			t.Errorf("virsh start with the chains but no filters = %v:\n%s", err, out)
		}
		if out, _ := s.env.Virsh(s.ctx, "domstate", "abox-hs"); !strings.Contains(out, "shut off") {
			t.Errorf("domain state after the refused starts: %s", out)
		}
		s.env.Virsh(s.ctx, "net-destroy", "abox-hs")
	})

	t.Run("start refuses while bridge netfilter is off", func(t *testing.T) {
		sw := "net.bridge.bridge-nf-call-iptables"
		if out, err := s.inNS(10*time.Second, "sysctl", "-w", sw+"=0"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		out, err := s.abox("start", "hs")
		s.inNS(10*time.Second, "sysctl", "-w", sw+"=1")
		if err == nil || !strings.Contains(out, "bridge netfilter is off") {
			t.Errorf("start with %s=0 = %v:\n%s", sw, err, out)
		}
		if out, _ := s.env.Virsh(s.ctx, "domstate", "abox-hs"); !strings.Contains(out, "shut off") {
			t.Errorf("the guest was booted although bridge netfilter is off: %s", out)
		}
	})

	t.Run("a damaged instance gets a clear error and remove --force cleans it", func(t *testing.T) {
		s.mustAbox("create", "dmg", "--accel", "tcg")
		dmg := s.state("dmg")
		f := layout.Instance("dmg")
		st, _ := os.ReadFile(f.State)
		os.WriteFile(f.State, []byte(strings.Replace(string(st), `"bridge": "`+dmg.Bridge+`"`, `"bridge": "eth0 -j ACCEPT"`, 1)), 0o600)
		out, err := s.abox("start", "dmg")
		if err == nil || !strings.Contains(out, "damaged") || !strings.Contains(out, "remove --force dmg") {
			t.Errorf("start of a damaged instance = %v:\n%s", err, out)
		}
		s.mustAbox("remove", "--force", "dmg")
		s.checkGone(t, "dmg", dmg.Bridge)
	})

	t.Run("stop and remove leave nothing", func(t *testing.T) {
		s.mustAbox("remove", "--force", "hs")
		s.checkGone(t, "hs", hs.Bridge)
	})
}

// checkGone checks that nothing of instance name is left: its directory,
// domain, network, nwfilter, bridge, chains in both families, processes.
func (s *suite) checkGone(t *testing.T, name, bridge string) {
	t.Helper()
	if _, err := os.Stat(paths.Layout{Root: s.home}.InstanceDir(name)); err == nil {
		t.Errorf("%s: directory still there", name)
	}
	for _, args := range [][]string{{"list", "--all", "--name"}, {"net-list", "--all", "--name"}, {"nwfilter-list"}} {
		if out, _ := s.env.Virsh(s.ctx, args...); strings.Contains(out, "abox-"+name+"\n") || strings.Contains(out, "abox-"+name+" ") {
			t.Errorf("%s: virsh %s still lists it:\n%s", name, args[0], out)
		}
	}
	if out, _ := s.inNS(10*time.Second, "ip", "link", "show", bridge); !strings.Contains(out, "does not exist") {
		t.Errorf("%s: bridge %s still exists", name, bridge)
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		out, err := s.inNS(10*time.Second, tool, "-w", "10", "-t", hostfw.Table, "-S")
		if err != nil || strings.Contains(out, bridge) {
			t.Errorf("%s: %s still mentions %s (%v):\n%s", name, tool, bridge, err, out)
		}
	}
	if out, err := run(s.ctx, "pgrep", "-f", "daemon (supervise|run) "+name+"$"); err == nil {
		t.Errorf("%s: daemon processes left: %s", name, out)
	}
}
