package libvirt

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// FuzzRenderTemplate: a domain template is a repository's file. Whatever
// its text, RenderTemplate refuses it or returns a domain that, read back
// as libvirt will get it, is abox's instance (its name, abox's metadata)
// and passes the same check again: what is defined is held to what was
// checked, however the reading fills it in.
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
		desktopTemplate,
		// Found by the fuzzer: an empty type is encoded as no type, which
		// reads back as pty (the byte-for-byte oracle was wrong).
		addDevice(`<serial type=''></serial>`),
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
		if _, err := checkTemplate(out, p); err != nil {
			t.Fatalf("template %q: the domain defined, read back, fails the check: %v\n%s", text, err, out)
		}
		// Not byte for byte: libvirtxml fills in defaults when it reads
		// (a <serial> whose type was empty comes back as type pty, as
		// libvirt reads it too), so the document read back may encode
		// differently; it is the check it passes that matters.
		if _, err := d.Marshal(); err != nil {
			t.Fatalf("template %q: the domain defined, read back, does not encode: %v", text, err)
		}
		if meta, err := metadataXML(p); err != nil || d.Metadata == nil || d.Metadata.XML != meta {
			t.Fatalf("template %q: metadata %+v, want abox's", text, d.Metadata)
		}
	})
}
