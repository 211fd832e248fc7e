package image

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// secret is what a hostile image tries to copy out of a host file.
const secret = "HOST-SECRET-7f3a91 root:$6$hash:19000:0:99999:7:::"

func needQemuImg(t *testing.T) {
	t.Helper()
	need.Program(t, "qemu-img")
}

func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// diskBytes is the guest-visible content of a stored qcow2, as raw bytes.
func diskBytes(t *testing.T, qcow2 string) []byte {
	t.Helper()
	raw := filepath.Join(t.TempDir(), "out.raw")
	qemuImg(t, "convert", "-f", "qcow2", "-O", "raw", qcow2, raw)
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestImportNeverReadsOtherHostFiles: every way an image header can name
// another host file (qcow2 backing file, qcow2 external data file, a vmdk
// descriptor's extent) is built with the real qemu-img around a secret host
// file, and the import either refuses it or stores bytes that do not
// contain the secret.
func TestImportNeverReadsOtherHostFiles(t *testing.T) {
	needQemuImg(t)
	ctx := context.Background()
	dir := t.TempDir()
	hostFile := filepath.Join(dir, "shadow")
	if err := os.WriteFile(hostFile, []byte(secret+strings.Repeat("\n", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	dataFile := filepath.Join(dir, "datafile.qcow2")
	qemuImg(t, "create", "-f", "qcow2", "-o", "data_file="+hostFile+",data_file_raw=on", dataFile, "1M")
	dataFileNoRaw := filepath.Join(dir, "datafile-noraw.qcow2")
	qemuImg(t, "create", "-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "other-data"), dataFileNoRaw, "1M")
	backed := filepath.Join(dir, "backed.qcow2")
	qemuImg(t, "create", "-f", "qcow2", "-F", "raw", "-b", hostFile, backed, "1M")
	// A monolithicFlat vmdk is a text descriptor naming its extent file;
	// point the extent at the secret.
	vmdk := filepath.Join(dir, "disk.vmdk")
	qemuImg(t, "create", "-f", "vmdk", "-o", "subformat=monolithicFlat", vmdk, "1M")
	desc, err := os.ReadFile(vmdk)
	if err != nil {
		t.Fatal(err)
	}
	desc = bytes.Replace(desc, []byte(`"disk-flat.vmdk"`), []byte(`"`+hostFile+`"`), 1)
	if err := os.WriteFile(vmdk, desc, 0o644); err != nil {
		t.Fatal(err)
	}

	s := NewStore(t.TempDir(), ExecRunner{}, nil)
	for i, tt := range []struct {
		name, file string
		refused    string // "" means imported, as raw bytes
	}{
		{"qcow2 external data file (raw)", dataFile, "external data file"},
		{"qcow2 external data file", dataFileNoRaw, "external data file"},
		{"qcow2 backing file", backed, "backing file"},
		{"vmdk extent naming a host file", vmdk, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name := "img" + strconv.Itoa(i)
			img, err := s.Import(ctx, name, tt.file)
			if tt.refused != "" {
				if err == nil && bytes.Contains(diskBytes(t, img.Disk()), []byte(secret)) {
					t.Fatalf("Import copied the host file's secret into the base")
				}
				if err == nil || !errors.Is(err, ErrUnsafeImage) || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("Import = %v, want ErrUnsafeImage naming %q", err, tt.refused)
				}
				if _, gerr := s.Get(name); gerr == nil {
					t.Errorf("a refused image was installed")
				}
				return
			}
			if err != nil {
				t.Fatalf("Import = %v, want it imported as raw bytes", err)
			}
			if img.SourceFormat != "raw" {
				t.Errorf("source format %q, want raw (never probed)", img.SourceFormat)
			}
			if b := diskBytes(t, img.Disk()); bytes.Contains(b, []byte(secret)) {
				t.Errorf("the stored disk holds the host file's secret")
			}
		})
	}
}

func header(mod func(b []byte) []byte) []byte {
	b := fakeQcow2(1 << 20)
	b = append(b, make([]byte, 64)...) // room for extensions, zero = end
	if mod != nil {
		b = mod(b)
	}
	return b
}

func TestCheckQcow2(t *testing.T) {
	be := binary.BigEndian
	ext := func(typ uint32) func([]byte) []byte {
		return func(b []byte) []byte {
			be.PutUint32(b[104:], typ)
			be.PutUint32(b[108:], 8)
			return b
		}
	}
	tests := []struct {
		name string
		b    []byte
		want string // "" = accepted
	}{
		{"plain v3", header(nil), ""},
		{"v2", header(func(b []byte) []byte { be.PutUint32(b[4:], 2); return b }), ""},
		{"lazy refcounts and zstd", header(func(b []byte) []byte {
			be.PutUint64(b[72:], incompatCompression|incompatExtendedL2)
			be.PutUint64(b[80:], compatLazyRefcounts)
			return b
		}), ""},
		{"feature table extension", header(ext(extFeatureTable)), ""},
		{"truncated", header(nil)[:50], "truncated"},
		{"version 4", header(func(b []byte) []byte { be.PutUint32(b[4:], 4); return b }), "version 4"},
		{"backing file", header(func(b []byte) []byte {
			be.PutUint64(b[8:], 120)
			be.PutUint32(b[16:], 4)
			copy(b[120:], "/etc")
			return b
		}), "backing file /etc"},
		{"encrypted", header(func(b []byte) []byte { be.PutUint32(b[32:], 2); return b }), "encrypted"},
		{"data file bit", header(func(b []byte) []byte { be.PutUint64(b[72:], incompatDataFile); return b }), "external data file"},
		{"corrupt", header(func(b []byte) []byte { be.PutUint64(b[72:], incompatCorrupt); return b }), "corrupt"},
		{"unknown incompatible bit", header(func(b []byte) []byte { be.PutUint64(b[72:], 1<<9); return b }), "incompatible feature bits 0x200"},
		{"unknown compatible bit", header(func(b []byte) []byte { be.PutUint64(b[80:], 1<<3); return b }), "compatible feature bits 0x8"},
		{"raw data file autoclear", header(func(b []byte) []byte { be.PutUint64(b[88:], autoclearDataFileRaw); return b }), "raw external data file"},
		{"unknown autoclear bit", header(func(b []byte) []byte { be.PutUint64(b[88:], 1<<5); return b }), "autoclear feature bits 0x20"},
		{"data file extension", header(ext(extDataFile)), "external data file"},
		{"backing format extension", header(ext(extBackingFmt)), "backing file format"},
		{"encryption extension", header(ext(extEncryption)), "encryption header"},
		{"unknown extension", header(ext(0x12345678)), "0x12345678"},
		{"header length past the data", header(func(b []byte) []byte { be.PutUint32(b[100:], 1<<20); return b }), "header length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkQcow2(tt.b)
			if tt.want == "" {
				if err != nil {
					t.Errorf("checkQcow2 = %v, want accepted", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrUnsafeImage) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("checkQcow2 = %v, want ErrUnsafeImage containing %q", err, tt.want)
			}
		})
	}
}

// TestCheckQcow2RealImages: what the real qemu-img writes by default, and
// with the options a user might have used, passes the header check.
func TestCheckQcow2RealImages(t *testing.T) {
	needQemuImg(t)
	for _, opts := range []string{"", "compat=0.10", "lazy_refcounts=on", "compression_type=zstd", "extended_l2=on,cluster_size=128k"} {
		f := filepath.Join(t.TempDir(), "x.qcow2")
		args := []string{"create", "-f", "qcow2"}
		if opts != "" {
			args = append(args, "-o", opts)
		}
		qemuImg(t, append(args, f, "4M")...)
		if err := checkQcow2Header(f); err != nil {
			t.Errorf("qcow2 made with %q: %v", opts, err)
		}
	}
}
