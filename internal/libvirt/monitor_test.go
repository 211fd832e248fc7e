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

// TestTemplateMonitorChannel: a user template gets abox's monitor channel
// as the hardened domain does, and may not bring one under its name.
func TestTemplateMonitorChannel(t *testing.T) {
	p := testParams()
	xml, _, err := RenderTemplate(goodTemplate, p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(xml, MonitorChannel) {
		t.Fatalf("a template domain without a monitor has its channel:\n%s", xml)
	}
	p.MonitorSocket = "/var/lib/abox/instances/dev/run/monitor.sock"
	xml, _, err = RenderTemplate(goodTemplate, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<source mode="bind" path="/var/lib/abox/instances/dev/run/monitor.sock">`, `<target type="virtio" name="org.abox.monitor.0">`} {
		if !strings.Contains(xml, want) {
			t.Errorf("template domain lacks %s:\n%s", want, xml)
		}
	}
	own := addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/other.sock'/><target type='virtio' name='org.abox.monitor.0'/></channel>`)
	if _, _, err := RenderTemplate(own, p); err == nil || !strings.Contains(err.Error(), "abox's monitor channel") {
		t.Errorf("a template's own monitor channel: %v", err)
	}
}
