// Package paths names every file and directory abox keeps on disk, rooted at
// ABOX_HOME so that tests and several users can run side by side.
package paths

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// EnvHome overrides the data root.
const EnvHome = "ABOX_HOME"

// RootHome is the data root of root. QEMU runs as an unprivileged user
// (libvirt-qemu) that cannot traverse /root, so root's instances live here.
const RootHome = "/var/lib/abox"

// Home returns the data root: $ABOX_HOME, else /var/lib/abox for root, else
// $XDG_DATA_HOME/abox, else ~/.local/share/abox.
func Home() (string, error) {
	if h := os.Getenv(EnvHome); h != "" {
		return filepath.Abs(h)
	}
	if os.Geteuid() == 0 {
		return RootHome, nil
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "abox"), nil
	}
	u, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("finding the abox data directory: %w (set %s)", err, EnvHome)
	}
	if u == "" {
		return "", errors.New("finding the abox data directory: no home directory (set " + EnvHome + ")")
	}
	return filepath.Join(u, ".local", "share", "abox"), nil
}

// Layout resolves paths below one data root.
type Layout struct {
	// Root is absolute.
	Root string
}

// Default returns the layout for Home().
func Default() (Layout, error) {
	h, err := Home()
	if err != nil {
		return Layout{}, err
	}
	return Layout{Root: h}, nil
}

func (l Layout) Instances() string              { return filepath.Join(l.Root, "instances") }
func (l Layout) Images() string                 { return filepath.Join(l.Root, "images") }
func (l Layout) InstanceDir(name string) string { return filepath.Join(l.Instances(), name) }

// Files of one instance directory.
func (l Layout) Allowlist(name string) string {
	return filepath.Join(l.InstanceDir(name), "allowlist.txt")
}
func (l Layout) RunDir(name string) string    { return filepath.Join(l.InstanceDir(name), "run") }
func (l Layout) APISocket(name string) string { return filepath.Join(l.RunDir(name), "api.sock") }
func (l Layout) LogsDir(name string) string   { return filepath.Join(l.InstanceDir(name), "logs") }
func (l Layout) KeyLog(name string) string    { return filepath.Join(l.LogsDir(name), "keys.log") }
func (l Layout) CADir(name string) string     { return filepath.Join(l.InstanceDir(name), "ca") }
