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

func (l Layout) Instances() string { return filepath.Join(l.Root, "instances") }
func (l Layout) Images() string    { return filepath.Join(l.Root, "images") }

// Secrets holds the host-side secret store (internal/secrets), 0700: the
// values the proxy injects, their bindings and the guests' placeholders.
// It is outside every instance directory, so no export archive or
// snapshot of an instance can hold a value.
func (l Layout) Secrets() string { return filepath.Join(l.Root, "secrets") }

// AgentCache keeps monitor agent bundles (Tetragon), by digest.
func (l Layout) AgentCache() string             { return filepath.Join(l.Root, "cache", "tetragon") }
func (l Layout) InstanceDir(name string) string { return filepath.Join(l.Instances(), name) }

// StateFile is an instance's definition, written last at create, so a
// directory without it is a creation in progress (or an interrupted one)
// and is not an instance.
const StateFile = "instance.json"

// Instance names every file of one instance directory. It is the only place
// these names are spelled; code and tests take them from here.
type Instance struct {
	Dir        string
	State      string
	Disk       string
	Seed       string
	SSHKey     string // private key, 0600
	KnownHosts string
	Allowlist  string
	CADir      string
	LogsDir    string
	SerialLog  string
	KeyLog     string
	DNSLog     string // the DNS filter's decision lines
	HTTPLog    string // the proxy's decision lines
	DaemonLog  string // the filter daemon's diagnostics
	RunDir     string
	APISocket  string
	DaemonPID  string // the supervisor's pid
	Lock       string
	// Runtime monitor (instances created with --monitor): the channel's
	// host socket (bound by libvirt), the normalised event log, the status
	// file, the monitor supervisor's pid and the monitor's diagnostics.
	MonitorSocket string
	MonitorLog    string
	MonitorStatus string
	MonitorPID    string
	MonitorDaemon string
	// MonitorAgent records the guest side's last setup (the bundle
	// installed, when, how long it took); MonitorAgentLog is the log of a
	// setup run in the background (start --no-wait).
	MonitorAgent    string
	MonitorAgentLog string
	// TapLock is held shared by every running tap (the last one turns the
	// TLS key log off).
	TapLock string
	// BootDir holds an imported instance's own kernel and initrd (direct
	// kernel boot without the base image it was created from).
	BootDir string
	Kernel  string
	Initrd  string
}

// Instance returns the files of instance name.
func (l Layout) Instance(name string) Instance { return InstanceIn(l.InstanceDir(name)) }

// InstanceIn returns the files of the instance whose directory is dir:
// every path abox itself uses there (libvirt's template check reserves
// them all, so a template cannot bind a socket over one).
func InstanceIn(dir string) Instance {
	logs := filepath.Join(dir, "logs")
	run := filepath.Join(dir, "run")
	return Instance{
		Dir:        dir,
		State:      filepath.Join(dir, StateFile),
		Disk:       filepath.Join(dir, "disk.qcow2"),
		Seed:       filepath.Join(dir, "seed.iso"),
		SSHKey:     filepath.Join(dir, "ssh", "id_ed25519"),
		KnownHosts: filepath.Join(dir, "ssh", "known_hosts"),
		Allowlist:  filepath.Join(dir, "allowlist.txt"),
		CADir:      filepath.Join(dir, "ca"),
		LogsDir:    logs,
		SerialLog:  filepath.Join(logs, "serial.log"),
		KeyLog:     filepath.Join(logs, "keys.log"),
		DNSLog:     filepath.Join(logs, "dns.log"),
		HTTPLog:    filepath.Join(logs, "http.log"),
		DaemonLog:  filepath.Join(logs, "daemon.log"),
		RunDir:     run,
		APISocket:  filepath.Join(run, "api.sock"),
		DaemonPID:  filepath.Join(run, "daemon.pid"),
		Lock:       filepath.Join(dir, ".lock"),

		MonitorSocket:   filepath.Join(run, "monitor.sock"),
		MonitorLog:      filepath.Join(logs, "monitor.log"),
		MonitorStatus:   filepath.Join(run, "monitor.json"),
		MonitorPID:      filepath.Join(run, "monitor.pid"),
		MonitorDaemon:   filepath.Join(logs, "monitor-daemon.log"),
		MonitorAgent:    filepath.Join(run, "monitor-agent.json"),
		MonitorAgentLog: filepath.Join(logs, "monitor-agent.log"),
		TapLock:         filepath.Join(run, "tap.lock"),

		BootDir: filepath.Join(dir, "boot"),
		Kernel:  filepath.Join(dir, "boot", "kernel"),
		Initrd:  filepath.Join(dir, "boot", "initrd"),
	}
}

// Shorthands for the files commands name most.
func (l Layout) Allowlist(name string) string { return l.Instance(name).Allowlist }
func (l Layout) RunDir(name string) string    { return l.Instance(name).RunDir }
func (l Layout) APISocket(name string) string { return l.Instance(name).APISocket }
func (l Layout) LogsDir(name string) string   { return l.Instance(name).LogsDir }
func (l Layout) KeyLog(name string) string    { return l.Instance(name).KeyLog }
func (l Layout) CADir(name string) string     { return l.Instance(name).CADir }
