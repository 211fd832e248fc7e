package image

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// An image file is read by qemu-img as root, so its header decides which
// host files qemu-img opens: a qcow2 can name a backing file or an
// external data file (any host path, /etc/shadow included), and `qemu-img
// convert` then copies that file's bytes into the base every guest boots
// from. Other formats (vmdk descriptors, for one) can name extent files the
// same way. So abox never lets qemu-img guess: a file is qcow2 when it
// starts with the qcow2 magic and raw otherwise, the format is always
// passed explicitly, and a qcow2 is accepted only when its header, read
// here byte by byte, names no external file and uses no feature abox does
// not know. qemu-img's own report is checked as a second opinion, and the
// converted result is inspected again before it is installed.

// qcow2Magic starts every qcow2 file ("QFI\xfb").
const qcow2Magic = 0x514649fb

// The qcow2 header feature bits abox knows (qcow2.txt in QEMU's docs).
const (
	incompatDirty       = 1 << 0
	incompatCorrupt     = 1 << 1
	incompatDataFile    = 1 << 2
	incompatCompression = 1 << 3
	incompatExtendedL2  = 1 << 4

	compatLazyRefcounts = 1 << 0

	autoclearBitmaps     = 1 << 0
	autoclearDataFileRaw = 1 << 1
)

// Header extension types.
const (
	extEnd          = 0x00000000
	extBackingFmt   = 0xe2792aca
	extFeatureTable = 0x6803f857
	extBitmaps      = 0x23852875
	extEncryption   = 0x0537be77
	extDataFile     = 0x44415441
)

// headerLimit bounds how much of a file is read for its header and
// extensions: they must lie in the first cluster, and 2 MiB is qcow2's
// largest cluster.
const headerLimit = 2 << 20

// ErrUnsafeImage is wrapped by every refusal of an image whose header
// could make qemu-img or QEMU read other host files.
var ErrUnsafeImage = errors.New("image refused")

func unsafeImage(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsafeImage, fmt.Sprintf(format, args...))
}

// sniffFormat returns "qcow2" when the file starts with the qcow2 magic and
// "raw" otherwise. Nothing else is probed: raw is the one format whose
// contents can never name another file.
func sniffFormat(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return "raw", nil
		}
		return "", err
	}
	if binary.BigEndian.Uint32(magic[:]) == qcow2Magic {
		return "qcow2", nil
	}
	return "raw", nil
}

// checkQcow2Header reads the qcow2 header of file and refuses a backing
// file, an external data file, encryption, a corrupt image and any
// feature bit or header extension abox does not know.
func checkQcow2Header(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, headerLimit))
	if err != nil {
		return err
	}
	return checkQcow2(b)
}

// checkQcow2 is checkQcow2Header on the file's first bytes.
func checkQcow2(b []byte) error {
	if len(b) < 72 {
		return unsafeImage("qcow2 header is truncated")
	}
	be := binary.BigEndian
	if be.Uint32(b[0:]) != qcow2Magic {
		return unsafeImage("not a qcow2 header")
	}
	version := be.Uint32(b[4:])
	if version != 2 && version != 3 {
		return unsafeImage("qcow2 version %d is not one abox knows (want 2 or 3)", version)
	}
	if off, size := be.Uint64(b[8:]), be.Uint32(b[16:]); off != 0 || size != 0 {
		name := ""
		if off < uint64(len(b)) && off+uint64(size) <= uint64(len(b)) {
			name = " " + string(b[off:off+uint64(size)])
		}
		return unsafeImage("the qcow2 names a backing file%s; flatten it with `qemu-img convert -O qcow2` first", name)
	}
	clusterBits := be.Uint32(b[20:])
	if clusterBits < 9 || clusterBits > 21 {
		return unsafeImage("qcow2 cluster bits %d out of range", clusterBits)
	}
	if crypt := be.Uint32(b[32:]); crypt != 0 {
		return unsafeImage("the qcow2 is encrypted (method %d); decrypt it first", crypt)
	}
	extStart := uint64(72)
	if version == 3 {
		if len(b) < 104 {
			return unsafeImage("qcow2 v3 header is truncated")
		}
		incompat, compat, autoclear := be.Uint64(b[72:]), be.Uint64(b[80:]), be.Uint64(b[88:])
		if incompat&incompatDataFile != 0 {
			return unsafeImage("the qcow2 keeps its data in an external data file (a host file qemu-img would copy into the base); convert it to a self-contained qcow2 first")
		}
		if incompat&incompatCorrupt != 0 {
			return unsafeImage("the qcow2 is marked corrupt; repair it with `qemu-img check -r all` first")
		}
		if u := incompat &^ (incompatDirty | incompatCompression | incompatExtendedL2); u != 0 {
			return unsafeImage("the qcow2 sets incompatible feature bits %#x that abox does not know", u)
		}
		if u := compat &^ compatLazyRefcounts; u != 0 {
			return unsafeImage("the qcow2 sets compatible feature bits %#x that abox does not know", u)
		}
		if autoclear&autoclearDataFileRaw != 0 {
			return unsafeImage("the qcow2 declares a raw external data file")
		}
		if u := autoclear &^ autoclearBitmaps; u != 0 {
			return unsafeImage("the qcow2 sets autoclear feature bits %#x that abox does not know", u)
		}
		headerLen := uint64(be.Uint32(b[100:]))
		if headerLen < 104 || headerLen > uint64(len(b)) {
			return unsafeImage("qcow2 header length %d out of range", headerLen)
		}
		extStart = headerLen
	}
	cluster := uint64(1) << clusterBits
	for off := extStart; ; {
		if off+8 > uint64(len(b)) || off+8 > cluster {
			return unsafeImage("qcow2 header extensions run past the first cluster")
		}
		typ, n := be.Uint32(b[off:]), uint64(be.Uint32(b[off+4:]))
		switch typ {
		case extEnd:
			return nil
		case extFeatureTable, extBitmaps:
		case extDataFile:
			return unsafeImage("the qcow2 names an external data file")
		case extBackingFmt:
			return unsafeImage("the qcow2 names a backing file format")
		case extEncryption:
			return unsafeImage("the qcow2 carries an encryption header")
		default:
			return unsafeImage("the qcow2 has a header extension %#08x that abox does not know", typ)
		}
		off += 8 + (n+7)&^7
	}
}

// qemuImgInfo is the part of `qemu-img info --output=json` we use.
type qemuImgInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
	FormatSpecific  struct {
		Type string `json:"type"`
		Data struct {
			DataFile string          `json:"data-file"`
			Encrypt  json.RawMessage `json:"encrypt"`
			Corrupt  bool            `json:"corrupt"`
		} `json:"data"`
	} `json:"format-specific"`
}

// Inspect reports the format ("qcow2" or "raw") and virtual size of a disk
// image file, refusing (ErrUnsafeImage) one whose header could make
// qemu-img or QEMU open another host file; see the comment at the top of
// this file. qemu-img runs with the format given (-f, never probed) and
// -U, so an image in use elsewhere is read, not locked.
func Inspect(ctx context.Context, run Runner, file string) (format string, virtualSize int64, err error) {
	format, err = sniffFormat(file)
	if err != nil {
		return "", 0, fmt.Errorf("inspecting %s: %w", file, err)
	}
	if format == "qcow2" {
		if err := checkQcow2Header(file); err != nil {
			return "", 0, fmt.Errorf("inspecting %s: %w", file, err)
		}
	}
	out, err := run.Run(ctx, "qemu-img", "info", "--output=json", "-U", "-f", format, file)
	if err != nil {
		return "", 0, fmt.Errorf("inspecting %s: %w", file, err)
	}
	var info qemuImgInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return "", 0, fmt.Errorf("inspecting %s: parsing qemu-img output: %w", file, err)
	}
	d := info.FormatSpecific.Data
	switch {
	case info.Format != format:
		return "", 0, fmt.Errorf("inspecting %s: qemu-img reads it as %q, want %q", file, info.Format, format)
	case info.BackingFilename != "":
		return "", 0, fmt.Errorf("inspecting %s: %w", file, unsafeImage("qemu-img reports a backing file %s", info.BackingFilename))
	case d.DataFile != "":
		return "", 0, fmt.Errorf("inspecting %s: %w", file, unsafeImage("qemu-img reports an external data file %s", d.DataFile))
	case len(d.Encrypt) > 0 && !bytes.Equal(d.Encrypt, []byte("null")):
		return "", 0, fmt.Errorf("inspecting %s: %w", file, unsafeImage("qemu-img reports encryption"))
	case d.Corrupt:
		return "", 0, fmt.Errorf("inspecting %s: %w", file, unsafeImage("qemu-img reports the image corrupt"))
	case info.VirtualSize <= 0:
		return "", 0, fmt.Errorf("inspecting %s: qemu-img reports a virtual size of %d", file, info.VirtualSize)
	}
	return format, info.VirtualSize, nil
}
