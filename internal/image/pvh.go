package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// A distribution kernel is a bzImage: real-mode setup code, then a
// decompressor that unpacks the compressed vmlinux and relocates it. Under
// TCG that decompressor is the slowest part of the kernel's boot (Debian's
// xz payload took ~2.3 s of a direct kernel boot here, before the kernel
// printed its first line). QEMU can instead load the uncompressed ELF
// vmlinux itself and enter it through the PVH entry point that Debian's
// kernels carry (CONFIG_PVH), so the image keeps that. The price is KASLR:
// the decompressor is what randomises the kernel's base. That protects the
// guest kernel from the guest's own processes, which abox does not rely on
// (the agent is root in the guest anyway).

// errNoPVH means a kernel cannot be booted through PVH; the bzImage is used.
var errNoPVH = errors.New("no PVH entry point")

// pvhKernel returns the ELF vmlinux inside the bzImage at path, provided it
// has a PVH entry point. xz payloads are unpacked with xz(1) through run,
// gzip ones in process.
func pvhKernel(ctx context.Context, run Runner, path string) ([]byte, error) {
	img, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	payload, err := bzImagePayload(img)
	if err != nil {
		return nil, err
	}
	var vmlinux []byte
	switch {
	case bytes.HasPrefix(payload, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		tmp, err := os.CreateTemp(filepath.Dir(path), ".payload-*.xz")
		if err != nil {
			return nil, err
		}
		defer os.Remove(tmp.Name())
		if _, err := tmp.Write(payload); err != nil {
			tmp.Close()
			return nil, err
		}
		if err := tmp.Close(); err != nil {
			return nil, err
		}
		if vmlinux, err = run.Run(ctx, "xz", "-dc", "--single-stream", tmp.Name()); err != nil {
			if errors.Is(err, exec.ErrNotFound) {
				// Debian always has xz-utils; elsewhere boot the bzImage.
				return nil, fmt.Errorf("%w: xz is not installed to unpack the kernel (apt-get install xz-utils)", errNoPVH)
			}
			return nil, fmt.Errorf("unpacking the kernel: %w", err)
		}
	case bytes.HasPrefix(payload, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(bytes.NewReader(payload))
		if err != nil {
			return nil, fmt.Errorf("unpacking the kernel: %w", err)
		}
		zr.Multistream(false)
		if vmlinux, err = io.ReadAll(io.LimitReader(zr, 1<<30)); err != nil {
			return nil, fmt.Errorf("unpacking the kernel: %w", err)
		}
	default:
		return nil, fmt.Errorf("%w: the kernel payload is neither xz nor gzip", errNoPVH)
	}
	if !hasPVHEntry(vmlinux) {
		return nil, fmt.Errorf("%w: the kernel has no XEN_ELFNOTE_PHYS32_ENTRY note", errNoPVH)
	}
	return vmlinux, nil
}

// bzImagePayload returns the compressed kernel of a bzImage, located by its
// setup header (boot protocol 2.08+: payload_offset and payload_length,
// relative to the protected-mode code after the setup sectors).
func bzImagePayload(img []byte) ([]byte, error) {
	if len(img) < 0x250 || string(img[0x202:0x206]) != "HdrS" {
		return nil, fmt.Errorf("%w: not a bzImage", errNoPVH)
	}
	if v := binary.LittleEndian.Uint16(img[0x206:]); v < 0x208 {
		return nil, fmt.Errorf("%w: boot protocol %#x has no payload fields", errNoPVH, v)
	}
	setup := int(img[0x1f1])
	if setup == 0 {
		setup = 4
	}
	start := (setup + 1) * 512
	off := int(binary.LittleEndian.Uint32(img[0x248:]))
	n := int(binary.LittleEndian.Uint32(img[0x24c:]))
	if off < 0 || n <= 0 || start+off+n > len(img) || start+off+n < start {
		return nil, fmt.Errorf("%w: payload outside the image", errNoPVH)
	}
	return img[start+off : start+off+n], nil
}

// hasPVHEntry reports whether an ELF kernel carries a Xen
// PHYS32_ENTRY note, which QEMU's PVH loader needs.
func hasPVHEntry(b []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return false
	}
	defer f.Close()
	const phys32Entry = 18 // XEN_ELFNOTE_PHYS32_ENTRY
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data, err := io.ReadAll(p.Open())
		if err != nil {
			return false
		}
		for len(data) >= 12 {
			nameSz := int(f.ByteOrder.Uint32(data))
			descSz := int(f.ByteOrder.Uint32(data[4:]))
			typ := f.ByteOrder.Uint32(data[8:])
			name := data[12:]
			if nameSz > len(name) {
				break
			}
			if typ == phys32Entry && string(bytes.TrimRight(name[:nameSz], "\x00")) == "Xen" {
				return true
			}
			step := 12 + align4(nameSz) + align4(descSz)
			if step > len(data) || step <= 0 {
				break
			}
			data = data[step:]
		}
	}
	return false
}

func align4(n int) int { return (n + 3) &^ 3 }
