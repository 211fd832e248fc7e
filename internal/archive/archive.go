// Package archive writes and reads abox instance archives (a gzip-compressed
// tar whose first entry is a versioned manifest naming every other entry),
// reading them as hostile input: an archive may come from someone else.
package archive

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
)

// Format and Version identify the archive layout; a reader refuses any
// other (a later abox that changes the layout bumps Version).
const (
	Format  = "abox-instance-archive"
	Version = 1
)

// Entry names. They are the only names an archive may hold, each at most
// once, in the manifest's order, the disk last.
const (
	ManifestName = "manifest.json"
	Allowlist    = "allowlist.txt"
	CACert       = "ca/ca.crt"
	CAKey        = "ca/ca.key"
	SSHKey       = "ssh/id_ed25519"
	UpstreamCA   = "upstream-ca.pem"
	Kernel       = "boot/kernel"
	Initrd       = "boot/initrd"
	// MonitorBundle is the instance's Tetragon bundle (a .tar.gz), checked
	// again on import like any bundle a user gives.
	MonitorBundle = "monitor-bundle.tar.gz"
	DiskQCOW2     = "disk.qcow2"
	DiskRaw       = "disk.raw"
)

// Bounds on what a reader accepts (bytes). The disk's is create's largest
// disk (4096 GiB) with room for qcow2 metadata.
const (
	MaxManifest = 1 << 20
	maxSmall    = 1 << 20
	maxText     = 16 << 20
	maxBoot     = 512 << 20
	maxBundle   = 512 << 20
	MaxDisk     = 4097 << 30
)

// limits is every name an archive may carry and its largest size.
var limits = map[string]int64{
	Allowlist: maxText, CACert: maxSmall, CAKey: maxSmall, SSHKey: maxSmall,
	UpstreamCA: maxText, Kernel: maxBoot, Initrd: maxBoot, MonitorBundle: maxBundle,
	DiskQCOW2: MaxDisk, DiskRaw: MaxDisk,
}

// IsDisk reports whether name is a disk entry.
func IsDisk(name string) bool { return name == DiskQCOW2 || name == DiskRaw }

// Manifest is the archive's first entry.
type Manifest struct {
	Format    string    `json:"format"`
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	// State is the instance's state as abox keeps it; the importer decodes
	// it strictly and checks it like user input.
	State json.RawMessage `json:"state"`
	// Files are the entries after the manifest, in order; exactly one is a
	// disk, and it is last.
	Files []File `json:"files"`
}

// File is one entry: its name (one of the constants above) and exact size.
type File struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// Error is an archive the reader refuses; Reason names the problem.
type Error struct{ Reason string }

func (e *Error) Error() string { return "reading archive: " + e.Reason }

func refuse(format string, args ...any) error { return &Error{Reason: fmt.Sprintf(format, args...)} }

// Check validates m as the reader does: format, version, entry names,
// order and sizes.
func (m Manifest) Check() error {
	if m.Format != Format {
		return refuse("manifest format %q, want %q (not an abox instance archive)", clip(m.Format), Format)
	}
	if m.Version != Version {
		return refuse("manifest version %d is not one this abox reads (it reads version %d); export the instance again with this abox, or use the abox that wrote it", m.Version, Version)
	}
	if len(bytes.TrimSpace(m.State)) == 0 || bytes.TrimSpace(m.State)[0] != '{' {
		return refuse("manifest has no instance state")
	}
	seen := map[string]bool{}
	for i, f := range m.Files {
		if err := checkName(f.Name); err != nil {
			return err
		}
		if seen[f.Name] {
			return refuse("manifest lists %q twice", f.Name)
		}
		seen[f.Name] = true
		if f.Size < 0 || f.Size > limits[f.Name] {
			return refuse("manifest gives %q %d bytes, over the %d this abox accepts", f.Name, f.Size, limits[f.Name])
		}
		if IsDisk(f.Name) != (i == len(m.Files)-1) {
			return refuse("manifest must list exactly one disk (%s or %s), last", DiskQCOW2, DiskRaw)
		}
	}
	if len(m.Files) == 0 {
		return refuse("manifest lists no disk")
	}
	return nil
}

// checkName refuses anything but the known entry names, saying why.
func checkName(name string) error {
	switch {
	case name == "":
		return refuse("an entry without a name")
	case strings.HasPrefix(name, "/"):
		return refuse("entry %q is an absolute path", clip(name))
	case name == ".." || strings.HasPrefix(name, "../") || strings.Contains(name, "/../") || strings.HasSuffix(name, "/.."):
		return refuse("entry %q leaves the archive (path traversal)", clip(name))
	case path.Clean(name) != name:
		return refuse("entry %q is not a clean path", clip(name))
	}
	if _, ok := limits[name]; !ok {
		return refuse("entry %q is not one an abox archive holds", clip(name))
	}
	return nil
}

// decodeManifest reads the manifest's bytes: the version first (so a later
// layout is named as such, not as an unknown field), then strictly.
func decodeManifest(b []byte) (Manifest, error) {
	var head struct {
		Format  string `json:"format"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return Manifest{}, refuse("manifest is not JSON: %v", err)
	}
	if head.Format != Format || head.Version != Version {
		return Manifest{}, Manifest{Format: head.Format, Version: head.Version}.Check()
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, refuse("manifest: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Manifest{}, refuse("manifest: data after the JSON object")
	}
	return m, m.Check()
}

// clip bounds an attacker's string in a message (which quotes it with %q,
// so it prints no control).
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
