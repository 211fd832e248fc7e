package libvirt

import (
	"strings"
	"testing"
)

func TestDomainMonitorChannel(t *testing.T) {
	p := testParams()
	xml, err := DomainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(xml, "<channel") {
		t.Fatalf("a domain without a monitor has a channel:\n%s", xml)
	}
	p.MonitorSocket = "/var/lib/abox/instances/dev/run/monitor.sock"
	xml, err = DomainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<source mode="bind" path="/var/lib/abox/instances/dev/run/monitor.sock">`, `<target type="virtio" name="org.abox.monitor.0">`} {
		if !strings.Contains(xml, want) {
			t.Errorf("domain lacks %s:\n%s", want, xml)
		}
	}
	p.MonitorSocket = "run/monitor.sock"
	if _, err := DomainXML(p); err == nil || !strings.Contains(err.Error(), "monitor socket") {
		t.Errorf("relative monitor socket: %v", err)
	}
}
