package libvirt

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

const goodTemplate = `<domain type='{{.DomainType}}'>
  <name>{{.DomainName}}</name>
  <uuid>{{.UUID}}</uuid>
  <memory unit='MiB'>{{.MemoryMiB}}</memory>
  <vcpu>{{.CPUs}}</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <source file='{{.DiskPath}}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <interface type='network'>
      <mac address='{{.MAC}}'/>
      <source network='{{.NetworkName}}'/>
      <filterref filter='{{.FilterName}}'/>
    </interface>
  </devices>
</domain>`

func TestRenderTemplate(t *testing.T) {
	tests := []struct {
		name    string
		tmpl    string
		wantErr string
	}{
		{"good", goodTemplate, ""},
		{"no filterref", strings.Replace(goodTemplate, "<filterref filter='{{.FilterName}}'/>", "", 1), "does not reference the packet filter"},
		{"other filter", strings.Replace(goodTemplate, "{{.FilterName}}", "clean-traffic", 1), "does not reference the packet filter"},
		{"second unfiltered nic", strings.Replace(goodTemplate, "</devices>", "<interface type='network'><source network='{{.NetworkName}}'/></interface></devices>", 1), "interface 1"},
		{"nic on default network", strings.Replace(goodTemplate, "<source network='{{.NetworkName}}'/>", "<source network='default'/>", 1), "not on network"},
		{"bridge nic", strings.Replace(goodTemplate, "<interface type='network'>", "<interface type='bridge'>", 1), "not on network"},
		{"no nic", strings.Replace(goodTemplate, "<interface", "<!--", 1), "not a libvirt domain"},
		{"hostdev", strings.Replace(goodTemplate, "</devices>", "<hostdev mode='subsystem' type='pci'/></devices>", 1), "hostdev"},
		{"qemu commandline", strings.Replace(strings.Replace(goodTemplate, "<domain ", "<domain xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0' ", 1), "</devices>", "</devices><qemu:commandline><qemu:arg value='-netdev'/></qemu:commandline>", 1), "qemu:commandline"},
		{"wrong name", strings.Replace(goodTemplate, "{{.DomainName}}", "other", 1), "domain name"},
		{"not xml", "hello", "not a libvirt domain"},
		{"unknown field", "{{.Password}}", "rendering"},
		{"bad syntax", "{{", "parsing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, warn, err := RenderTemplate(tt.tmpl, testParams())
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("RenderTemplate: %v", err)
				}
				if warn != TemplateWarning {
					t.Errorf("warning = %q, want TemplateWarning", warn)
				}
				if !strings.Contains(out, "<filterref filter='abox-dev'/>") {
					t.Errorf("rendered template lost the filterref:\n%s", out)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("RenderTemplate error = %v, want one containing %q", err, tt.wantErr)
			}
			if out != "" || warn != "" {
				t.Error("a refused template still returned output")
			}
		})
	}
}

// TestTemplateEscapesValues renders hostile paths and cmdline into both
// attribute positions (' and " quoted) and element text and checks the
// parsed values come back unchanged, with no injected elements.
func TestTemplateEscapesValues(t *testing.T) {
	p := testParams()
	p.DiskPath = `/x/a'"><hostdev mode='subsystem'/><disk x='&amp;`
	p.Kernel = "/k"
	p.Cmdline = `a</cmdline><kernel>/evil</kernel><cmdline>&"'`
	tmpl := strings.Replace(goodTemplate, "<os><type arch='x86_64'>hvm</type></os>",
		`<os><type arch="x86_64">hvm</type><kernel>{{.Kernel}}</kernel><cmdline>{{.Cmdline}}</cmdline></os>`, 1)
	tmpl = strings.Replace(tmpl, "<target dev='vda' bus='virtio'/>", `<target dev='vda' bus='virtio'/><serial>{{.DiskPath}}</serial>`, 1)
	tmpl = strings.Replace(tmpl, "</devices>", `<disk type="file" device="disk"><source file="{{.DiskPath}}"/><target dev="vdc" bus="virtio"/></disk></devices>`, 1)
	out, _, err := RenderTemplate(tmpl, p)
	if err != nil {
		t.Fatalf("RenderTemplate: %v", err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(out); err != nil {
		t.Fatal(err)
	}
	if len(d.Devices.Hostdevs) != 0 {
		t.Fatal("injected <hostdev> survived escaping")
	}
	if len(d.Devices.Disks) != 2 {
		t.Fatalf("got %d disks, want 2 (an injected disk survived?)", len(d.Devices.Disks))
	}
	for i, disk := range d.Devices.Disks {
		if disk.Source.File.File != p.DiskPath {
			t.Errorf("disk %d path = %q, want %q", i, disk.Source.File.File, p.DiskPath)
		}
	}
	if d.Devices.Disks[0].Serial != p.DiskPath {
		t.Errorf("element text = %q, want %q", d.Devices.Disks[0].Serial, p.DiskPath)
	}
	if d.OS.Cmdline != p.Cmdline || d.OS.Kernel != "/k" {
		t.Errorf("kernel/cmdline = %q/%q", d.OS.Kernel, d.OS.Cmdline)
	}
}
