package libvirt

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// FuzzRenderTemplate: a domain template is a repository's file. Whatever
// its text, RenderTemplate refuses it or returns a domain that, read back
// as libvirt will get it, is abox's instance (its name, abox's metadata)
// and passes the same check again, and encodes to the same bytes: what is
// defined is what was checked, not another reading of it. Rendering stays
// within MaxRenderedBytes.
func FuzzRenderTemplate(f *testing.F) {
	p := testParams()
	own, err := DomainXML(p)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		goodTemplate, own,
		addDevice(`<serial type='file'><source path='{{.SerialLogPath}}'/><target port='0'/></serial>`),
		addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/x.sock'/><target type='virtio' name='x'/></channel>`),
		addDevice(`<rng model='virtio'><backend model='random'>/dev/urandom</backend></rng><graphics type='vnc' listen='127.0.0.1'/>`),
		addDevice(`<disk type='file' device='cdrom'><source file='{{.SeedISOPath}}'/><target dev='sda' bus='sata'/><readonly/></disk>`),
		strings.Replace(goodTemplate, "<vcpu>", `<description>{{if .Kernel}}{{.Kernel}}{{else}}{{printf "%q" .Name}}{{end}}</description><vcpu>`, 1),
		strings.Replace(goodTemplate, "</devices>", "<futuredevice/></devices>", 1),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		out, _, err := RenderTemplate(text, p)
		if err != nil {
			return
		}
		var d libvirtxml.Domain
		if err := d.Unmarshal(out); err != nil {
			t.Fatalf("template %q: the domain defined does not parse: %v", text, err)
		}
		if d.Name != DomainName(p.Name) {
			t.Fatalf("template %q: defines the domain %q", text, d.Name)
		}
		if err := checkTemplateDomain(&d, p); err != nil {
			t.Fatalf("template %q: the domain defined, read back, fails the check: %v\n%s", text, err, out)
		}
		again, err := d.Marshal()
		if err != nil || again != out {
			t.Fatalf("template %q: the domain defined reads back as another document (%v):\n%s\n---\n%s", text, err, out, again)
		}
		if meta, err := metadataXML(p); err != nil || d.Metadata == nil || d.Metadata.XML != meta {
			t.Fatalf("template %q: metadata %+v, want abox's", text, d.Metadata)
		}
	})
}
