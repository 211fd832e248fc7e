//go:build e2e

package libvirt

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// bpduSender sends three configuration BPDUs out of the interface in
// argv[1] that claim the best possible root (priority 0, the sender's MAC).
const bpduSender = `import socket, struct, sys
dev = sys.argv[1]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
mac = bytes.fromhex(open('/sys/class/net/%s/address' % dev).read().strip().replace(':', ''))
root = struct.pack('!H', 0) + mac
bpdu = struct.pack('!HBBB', 0, 0, 0, 0) + root + struct.pack('!I', 0) + root + struct.pack('!HHHHH', 0x8001, 0, 20*256, 2*256, 15*256)
llc = b'\x42\x42\x03'
frame = bytes.fromhex('0180c2000000') + mac + struct.pack('!H', len(llc) + len(bpdu)) + llc + bpdu
for i in range(3):
    s.send(frame)
`

// TestE2EBridgeIgnoresGuestBPDUs: the instance bridge's STP setting
// decides whether the nwfilter's layer-2 "drop every other frame" rule
// (an ebtables nat PREROUTING rule on the guest's port) sees the guest's
// BPDUs. With the kernel's STP on the bridge takes them before ebtables
// does, and a guest can make itself the host bridge's root; the control
// shows that. With the setting BuildNetwork writes, the drop counts the
// BPDUs and the bridge's root stays its own.
func TestE2EBridgeIgnoresGuestBPDUs(t *testing.T) {
	need.Root(t, "network namespaces and ebtables")
	for _, tool := range []string{"ip", "ebtables", "python3"} {
		need.Program(t, tool)
	}
	n, err := BuildNetwork(testParams())
	if err != nil {
		t.Fatal(err)
	}
	stp := map[string]string{"on": "1", "off": "0"}[n.Bridge.STP]
	if stp == "" {
		t.Fatalf("network bridge STP = %q, want on or off", n.Bridge.STP)
	}
	// rootTaken reports whether a guest's BPDUs change the root of a
	// bridge with stp_state state, and how many frames the port's drop saw.
	rootTaken := func(state string) (bool, string) {
		id := os.Getpid()
		host, guest := fmt.Sprintf("abx-bpdh-%d", id), fmt.Sprintf("abx-bpdg-%d", id)
		sh := func(args ...string) string {
			t.Helper()
			out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %v: %s", args, err, out)
			}
			return string(out)
		}
		for _, ns := range []string{host, guest} {
			sh("ip", "netns", "add", ns)
			defer exec.Command("ip", "netns", "del", ns).Run()
		}
		const br = "abx-bpdu0"
		sh("ip", "-n", host, "link", "add", br, "type", "bridge", "forward_delay", "0", "stp_state", state)
		sh("ip", "link", "add", "vb0", "netns", guest, "type", "veth", "peer", "name", "vb1", "netns", host)
		sh("ip", "-n", host, "link", "set", "vb1", "master", br, "up")
		sh("ip", "-n", host, "link", "set", br, "up")
		sh("ip", "-n", guest, "link", "set", "vb0", "up")
		// What the nwfilter's last layer-2 rule on the guest's port is.
		sh("ip", "netns", "exec", host, "ebtables", "-t", "nat", "-A", "PREROUTING", "-i", "vb1", "-j", "DROP")
		rootID := func() string {
			return strings.TrimSpace(sh("ip", "netns", "exec", host, "cat", "/sys/class/net/"+br+"/bridge/root_id"))
		}
		before := rootID()
		sh("ip", "netns", "exec", guest, "python3", "-c", bpduSender, "vb0")
		time.Sleep(500 * time.Millisecond)
		counted := sh("ip", "netns", "exec", host, "ebtables", "-t", "nat", "-L", "PREROUTING", "--Lc")
		return rootID() != before, counted
	}
	if taken, _ := rootTaken("1"); !taken {
		t.Fatal("control: with STP on the guest's BPDUs did not change the bridge's root; the test proves nothing")
	}
	taken, counted := rootTaken(stp)
	if taken {
		t.Errorf("with the instance bridge's STP %s the guest's BPDUs made it the bridge's root, past the port's drop rule:\n%s", n.Bridge.STP, counted)
	}
	// At least the three BPDUs (the guest's interface may send IPv6
	// solicitations of its own as it comes up).
	var pcnt int
	if i := strings.Index(counted, "pcnt = "); i >= 0 {
		fmt.Sscanf(counted[i:], "pcnt = %d", &pcnt)
	}
	if pcnt < 3 {
		t.Errorf("the port's drop rule did not see the guest's 3 BPDUs:\n%s", counted)
	}
}
