package image

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// fakeRunner plays qemu-img, debootstrap (under unshare), chroot and mke2fs
// on plain files so the store and builder logic run without root or tools.
type fakeRunner struct {
	mu    sync.Mutex
	calls []string          // "name arg arg ..."
	info  map[string]string // file -> qemu-img info JSON; default raw
	fail  map[string]error  // "qemu-img convert", "mke2fs", ... -> error
	// atMke2fs, when set, inspects the root tree handed to mke2fs.
	atMke2fs func(root string) error
}

func (f *fakeRunner) key(name string, args []string) string {
	if name == "qemu-img" && len(args) > 0 {
		return name + " " + args[0]
	}
	return name
}

func (f *fakeRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	f.mu.Lock()
	f.calls = append(f.calls, strings.Join(append([]string{name}, args...), " "))
	f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	key := f.key(name, args)
	if err := f.fail[key]; err != nil {
		return nil, err
	}
	last := func(i int) string { return args[len(args)-i] }
	switch key {
	case "qemu-img info":
		if j, ok := f.info[last(1)]; ok {
			return []byte(j), nil
		}
		format, size, err := fakeVirtualSize(last(1))
		if err != nil {
			return nil, err
		}
		return []byte(fmt.Sprintf(`{"format":%q,"virtual-size":%d}`, format, size)), nil
	case "qemu-img convert":
		_, size, err := fakeVirtualSize(last(2))
		if err != nil {
			return nil, err
		}
		return nil, os.WriteFile(last(1), fakeQcow2(size), 0o644)
	case "unshare":
		// unshare --mount --propagation private debootstrap ... SUITE ROOT MIRROR
		if len(args) < 4 || args[3] != "debootstrap" {
			return nil, fmt.Errorf("unexpected unshare %v", args)
		}
		return nil, fakeDebootstrap(last(2))
	case "chroot":
		return nil, nil
	case "mke2fs":
		// mke2fs ... -d ROOT FILE SIZE
		root := ""
		for i, a := range args {
			if a == "-d" {
				root = args[i+1]
			}
		}
		if f.atMke2fs != nil {
			if err := f.atMke2fs(root); err != nil {
				return nil, err
			}
		}
		return nil, os.WriteFile(last(2), []byte("ext4 of "+root), 0o644)
	}
	return nil, errors.New("fakeRunner: unexpected command " + name)
}

// fakeQcow2 is a minimal valid qcow2 v3 header (no extensions) of a disk
// of size bytes: what the fake convert writes, and what Inspect's own
// header check accepts.
func fakeQcow2(size int64) []byte {
	b := make([]byte, 112)
	be := binary.BigEndian
	be.PutUint32(b[0:], qcow2Magic)
	be.PutUint32(b[4:], 3)
	be.PutUint32(b[20:], 16) // 64 KiB clusters
	be.PutUint64(b[24:], uint64(size))
	be.PutUint32(b[96:], 4)    // refcount order
	be.PutUint32(b[100:], 104) // header length; the end extension follows
	return b
}

// fakeVirtualSize reads a fakeQcow2's size, or a raw file's length.
func fakeVirtualSize(file string) (string, int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", 0, err
	}
	if len(b) >= 32 && binary.BigEndian.Uint32(b) == qcow2Magic {
		return "qcow2", int64(binary.BigEndian.Uint64(b[24:])), nil
	}
	return "raw", int64(len(b)), nil
}

func (f *fakeRunner) called(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// fakeDebootstrap lays out the few files the builder touches.
func fakeDebootstrap(root string) error {
	files := map[string]string{
		"boot/vmlinuz-6.1.0-9-amd64":     "kernel-old",
		"boot/initrd.img-6.1.0-9-amd64":  "initrd-old",
		"boot/vmlinuz-6.1.0-18-amd64":    "kernel",
		"boot/initrd.img-6.1.0-18-amd64": "initrd",
		"etc/resolv.conf":                "nameserver 192.0.2.53\n",
		"etc/ssh/ssh_host_ed25519_key":   "secret",
		"etc/ssh/sshd_config":            "# config\n",
		"etc/machine-id":                 "0123456789abcdef0123456789abcdef\n",
		"usr/share/doc/bash/README":      "docs",
		"var/cache/apt/archives/a.deb":   "deb",
	}
	for p, c := range files {
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, []byte(c), 0o644); err != nil {
			return err
		}
	}
	return nil
}
