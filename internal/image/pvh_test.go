package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// minimalELF is an ELF64 executable with one PT_NOTE segment holding one
// note of the given name and type.
func minimalELF(noteName string, noteType uint32) []byte {
	le := binary.LittleEndian
	name := append([]byte(noteName), 0)
	var note bytes.Buffer
	binary.Write(&note, le, uint32(len(name)))
	binary.Write(&note, le, uint32(8))
	binary.Write(&note, le, noteType)
	note.Write(name)
	for note.Len()%4 != 0 {
		note.WriteByte(0)
	}
	note.Write(make([]byte, 8)) // the descriptor: an entry address
	const ehsize, phsize = 64, 56
	var b bytes.Buffer
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0})
	b.Write(make([]byte, 8))
	binary.Write(&b, le, uint16(2))    // ET_EXEC
	binary.Write(&b, le, uint16(0x3e)) // EM_X86_64
	binary.Write(&b, le, uint32(1))
	binary.Write(&b, le, uint64(0x1000000)) // entry
	binary.Write(&b, le, uint64(ehsize))    // phoff
	binary.Write(&b, le, uint64(0))         // shoff
	binary.Write(&b, le, uint32(0))
	binary.Write(&b, le, uint16(ehsize))
	binary.Write(&b, le, uint16(phsize))
	binary.Write(&b, le, uint16(1)) // phnum
	binary.Write(&b, le, uint16(64))
	binary.Write(&b, le, uint16(0)) // shnum
	binary.Write(&b, le, uint16(0))
	// PT_NOTE
	binary.Write(&b, le, uint32(4))
	binary.Write(&b, le, uint32(4))
	binary.Write(&b, le, uint64(ehsize+phsize))
	binary.Write(&b, le, uint64(0))
	binary.Write(&b, le, uint64(0))
	binary.Write(&b, le, uint64(note.Len()))
	binary.Write(&b, le, uint64(note.Len()))
	binary.Write(&b, le, uint64(4))
	b.Write(note.Bytes())
	return b.Bytes()
}

// fakeBzImage wraps payload in a setup header the way a bzImage does.
func fakeBzImage(payload []byte) []byte {
	const setupSects = 1
	img := make([]byte, (setupSects+1)*512)
	img[0x1f1] = setupSects
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x206:], 0x20f)
	binary.LittleEndian.PutUint32(img[0x248:], 0x10) // payload_offset
	binary.LittleEndian.PutUint32(img[0x24c:], uint32(len(payload)))
	img = append(img, make([]byte, 0x10)...)
	img = append(img, payload...)
	return append(img, 1, 2, 3, 4) // the decompressed size trailer
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	w.Write(b)
	w.Close()
	return out.Bytes()
}

func TestPVHKernel(t *testing.T) {
	withPVH := minimalELF("Xen", 18)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name  string
		image []byte
		noPVH bool
	}{
		{"gzip payload with PVH note", fakeBzImage(gz(withPVH)), false},
		{"ELF without the PVH note", fakeBzImage(gz(minimalELF("Xen", 17))), true},
		{"PVH type under another owner", fakeBzImage(gz(minimalELF("GNU", 18))), true},
		{"not a bzImage", []byte("kernel"), true},
		{"payload not compressed", fakeBzImage(withPVH), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pvhKernel(context.Background(), ExecRunner{}, write("k", tc.image))
			if tc.noPVH {
				if !errors.Is(err, errNoPVH) {
					t.Fatalf("err = %v, want errNoPVH (the bzImage is used instead)", err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, withPVH) {
				t.Fatalf("pvhKernel = %d bytes, %v; want the vmlinux", len(got), err)
			}
		})
	}
	t.Run("xz payload through xz(1)", func(t *testing.T) {
		need.Program(t, "xz")
		cmd := exec.Command("xz", "-c", "--check=crc32")
		cmd.Stdin = bytes.NewReader(withPVH)
		x, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		got, err := pvhKernel(context.Background(), ExecRunner{}, write("kx", fakeBzImage(x)))
		if err != nil || !bytes.Equal(got, withPVH) {
			t.Fatalf("pvhKernel = %d bytes, %v", len(got), err)
		}
	})
}
